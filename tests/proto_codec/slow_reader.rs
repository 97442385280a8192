//! Megabytes of output on both outputs at once, read by a client that pauses: whole and in
//! order, the end event last. The slow client makes the process block on its full pipes
//! between batches, so each batch is read as its queue is taken (docs/design.md, "Output in
//! batches").

use std::time::{Duration, Instant};

use super::client::{run_to_end, start_sh};
use super::messages::process::{Event, EventResponse, Output};
use crate::common::connect::{Stream, WAIT};
use crate::common::start;

fn lines(from: u32, to: u32) -> Vec<u8> {
    (from..=to)
        .flat_map(|n| format!("{n}\n").into_bytes())
        .collect()
}

/// Reads a stream to its end slowly (a pause every `every` envelopes): stdout and stderr.
fn read_slowly(stream: &mut Stream, every: usize, pause: Duration) -> (Vec<u8>, Vec<u8>) {
    let (mut stdout, mut stderr, mut ended) = (Vec::new(), Vec::new(), false);
    let deadline = Instant::now() + Duration::from_secs(120);
    for n in 1.. {
        let left = deadline.saturating_duration_since(Instant::now());
        let envelope = stream
            .next_envelope_within(left)
            .expect("the stream ends in time");
        if envelope.flags & 0x02 != 0 {
            assert_eq!(envelope.message, b"{}", "a clean end");
            break;
        }
        assert!(!ended, "nothing after the end event");
        let event = super::client::decode::<EventResponse>(&envelope.message)
            .event
            .and_then(|e| e.event);
        match event {
            Some(Event::Data(data)) => match data.output {
                Some(Output::Stdout(b)) => stdout.extend(b),
                Some(Output::Stderr(b)) => stderr.extend(b),
                other => panic!("unexpected output {other:?}"),
            },
            Some(Event::End(end)) => {
                assert_eq!(end.exit_code, 0);
                ended = true;
            }
            Some(Event::Start(_) | Event::Keepalive(_)) => {}
            other => panic!("unexpected event {other:?}"),
        }
        if n % every == 0 {
            std::thread::sleep(pause);
        }
    }
    assert!(ended, "an end event");
    (stdout, stderr)
}

#[test]
fn both_outputs_arrive_whole_and_in_order_to_a_client_that_reads_slowly() {
    let daemon = start();
    // stdout and stderr written at once by two writers, then more stdout after stderr ended.
    let script = "seq 1 1500000 & seq 1 400000 >&2; wait; seq 1500001 1600000";
    let mut stream = start_sh(&daemon, script);
    let (stdout, stderr) = read_slowly(&mut stream, 16, Duration::from_millis(5));
    assert_eq!(stdout.len(), lines(1, 1_600_000).len());
    assert!(stdout == lines(1, 1_600_000), "stdout differs");
    assert!(stderr == lines(1, 400_000), "stderr differs");
    // Small writes after pauses (read by the I/O thread after its rest) still come whole.
    let run = run_to_end(
        &mut start_sh(&daemon, "seq 1 100; sleep 0.05; seq 1 50 >&2; printf x"),
        WAIT,
    );
    assert_eq!(
        (run.stdout, run.stderr),
        ([lines(1, 100), b"x".to_vec()].concat(), lines(1, 50))
    );
}
