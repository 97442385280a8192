//! A peer's pace never holds a worker: slow readers, withheld and trickled bodies, unread
//! pipelined answers, requests waiting for a worker past the header deadline, many partial
//! heads, and the RFC 9112 rules on `Host`. Small scale: one or two workers, a few peers.

use std::fs;
use std::io::{BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::common::{assert_health_within, builder, low_byte, read_reply, write_file, TOKEN};

/// True when the peer closed `stream` (end of stream or reset), false while it stays open.
fn is_closed(stream: &mut TcpStream) -> bool {
    stream
        .set_read_timeout(Some(Duration::from_millis(20)))
        .unwrap();
    let mut byte = [0u8; 1];
    match stream.read(&mut byte) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    }
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| low_byte(i * 7 % 251)).collect()
}

#[test]
fn slow_readers_of_big_downloads_hold_no_worker() {
    let daemon = builder().arg("--workers").arg("1").start();
    let data = pattern(32 << 20);
    let file = daemon.dir.path().join("big.bin");
    write_file(&file, &data);
    let request = format!(
        "GET /files?path={} HTTP/1.1\r\nHost: t\r\nX-Access-Token: {TOKEN}\r\n\r\n",
        file.display()
    );
    // Four readers that read nothing: their answers fill the socket buffers and wait.
    let readers: Vec<TcpStream> = (0..4)
        .map(|_| {
            let mut stream = daemon.connect();
            stream.write_all(request.as_bytes()).unwrap();
            stream
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    for _ in 0..5 {
        assert_health_within(&daemon, Duration::from_secs(1));
    }
    // Then they read, and every byte arrives.
    for stream in readers {
        let reply = read_reply(&mut BufReader::new(stream), false).expect("download answered");
        assert_eq!(reply.status, 200);
        assert!(reply.body == data, "the download arrived whole");
    }
}

#[test]
fn a_reader_that_takes_nothing_for_the_send_timeout_is_closed() {
    let daemon = builder()
        .arg("--workers")
        .arg("1")
        .arg("--send-timeout")
        .arg("1")
        .start();
    let file = daemon.dir.path().join("big.bin");
    write_file(&file, &pattern(32 << 20));
    let mut stream = daemon.connect();
    let request = format!(
        "GET /files?path={} HTTP/1.1\r\nHost: t\r\nX-Access-Token: {TOKEN}\r\n\r\n",
        file.display()
    );
    stream.write_all(request.as_bytes()).unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    // Closed: reading ends well before the 32 MiB.
    let mut received = Vec::new();
    let _ = stream.read_to_end(&mut received);
    assert!(received.len() < 32 << 20, "{} bytes", received.len());
    assert_health_within(&daemon, Duration::from_secs(1));
}

#[test]
fn withheld_bodies_before_and_after_authentication_freeze_nothing() {
    let daemon = builder().arg("--workers").arg("1").start();
    // No token: answered from the head alone, at once, whatever the declared body.
    let mut unauthenticated = daemon.connect();
    unauthenticated
        .write_all(b"POST /files?path=x HTTP/1.1\r\nHost: t\r\nContent-Length: 1000000\r\n\r\n")
        .unwrap();
    let reply = read_reply(&mut BufReader::new(unauthenticated), false).unwrap();
    assert_eq!(reply.status, 401);
    // A body no route reads, and an authenticated upload whose body stalls: neither holds the
    // only worker.
    let mut health_with_body = daemon.connect();
    health_with_body
        .write_all(b"GET /health HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n")
        .unwrap();
    let reply = read_reply(
        &mut BufReader::new(health_with_body.try_clone().unwrap()),
        false,
    );
    assert_eq!(reply.unwrap().status, 204, "answered before its body");
    let mut upload = daemon.connect();
    let head = format!(
        "POST /files?path=stalled.bin HTTP/1.1\r\nHost: t\r\nX-Access-Token: {TOKEN}\r\n\
         Content-Length: 10\r\n\r\nhalf!"
    );
    upload.write_all(head.as_bytes()).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    for _ in 0..5 {
        assert_health_within(&daemon, Duration::from_secs(1));
    }
    // The upload completes when the rest comes.
    upload.write_all(b"done!").unwrap();
    let reply = read_reply(&mut BufReader::new(upload), false).unwrap();
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(
        fs::read(daemon.dir.path().join("root/stalled.bin")).unwrap(),
        b"half!done!"
    );
}

#[test]
fn a_chunked_body_trickled_under_the_minimum_rate_is_cut() {
    let daemon = builder().arg("--body-timeout").arg("1").start();
    let mut stream = daemon.connect();
    let head = format!(
        "POST /files?path=trickle.bin HTTP/1.1\r\nHost: t\r\nX-Access-Token: {TOKEN}\r\n\
         Transfer-Encoding: chunked\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).unwrap();
    let started = Instant::now();
    let mut writer = stream.try_clone().unwrap();
    let trickle = std::thread::spawn(move || {
        // One byte every 300 ms: each under the 1 s gap, the whole far under 500 bytes/s.
        for _ in 0..40 {
            if writer.write_all(b"1\r\na\r\n").is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(300));
        }
    });
    let reply = read_reply(&mut BufReader::new(stream), false).expect("answered");
    reply.assert_error(
        400,
        "error reading the request body: request body slower than 500 bytes/s",
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    let _ = trickle.join();
    assert!(!daemon.dir.path().join("root/trickle.bin").exists());
}

#[test]
fn a_megabyte_of_pipelined_requests_whose_answers_are_not_read_is_answered_in_order() {
    let daemon = builder().arg("--workers").arg("2").start();
    let one = b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n";
    let count = (1 << 20) / one.len() + 1;
    let stream = daemon.connect();
    let mut writer = stream.try_clone().unwrap();
    let sender = std::thread::spawn(move || {
        for _ in 0..count {
            writer.write_all(one).unwrap();
        }
        writer
            .write_all(b"GET /health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            .unwrap();
    });
    // Nothing is read for a while: the daemon stops reading, others are served meanwhile.
    std::thread::sleep(Duration::from_millis(500));
    assert_health_within(&daemon, Duration::from_secs(1));
    let mut reader = BufReader::new(stream);
    let mut answered = 0;
    while let Some(reply) = read_reply(&mut reader, false) {
        assert_eq!(reply.status, 204);
        answered += 1;
    }
    sender.join().unwrap();
    assert_eq!(
        answered,
        count + 1,
        "every pipelined request answered, none lost"
    );
}

#[test]
fn a_complete_request_waiting_for_a_worker_outlives_the_header_deadline() {
    // The only worker blocks on a "disk" (a FIFO standing in for /proc/stat, opened by
    // /metrics) for longer than the header timeout; a /health sent meanwhile is answered.
    let proc_root = tempfile::tempdir().unwrap();
    let daemon = builder()
        .arg("--workers")
        .arg("1")
        .arg("--header-timeout")
        .arg("1")
        .arg("--proc-root")
        .arg(proc_root.path().to_str().unwrap())
        .start();
    let fifo = proc_root.path().join("stat");
    let status = std::process::Command::new("mkfifo").arg(&fifo).status();
    assert!(status.unwrap().success());
    let mut metrics = daemon.connect();
    let request = format!("GET /metrics HTTP/1.1\r\nHost: t\r\nX-Access-Token: {TOKEN}\r\n\r\n");
    metrics.write_all(request.as_bytes()).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let mut waiting = daemon.connect();
    waiting
        .write_all(b"GET /health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    // Unblock the worker: the FIFO's writer opens and closes it.
    drop(fs::OpenOptions::new().write(true).open(&fifo).unwrap());
    let reply = read_reply(&mut BufReader::new(waiting), false).expect("answered, not reset");
    assert_eq!(reply.status, 204);
    assert!(read_reply(&mut BufReader::new(metrics), false).is_some());
}

#[test]
fn partial_heads_share_a_budget_and_the_oldest_are_closed_past_it() {
    let daemon = builder().start();
    // 400 heads of 60 KiB that never end: 24 MB, over the 16 MiB budget.
    let filler = vec![b'a'; 60 * 1024];
    let mut heads = Vec::new();
    for _ in 0..400 {
        let mut stream = daemon.connect();
        stream
            .write_all(b"GET /health HTTP/1.1\r\nHost: t\r\nX-Fill: ")
            .unwrap();
        stream.write_all(&filler).unwrap();
        heads.push(stream);
    }
    std::thread::sleep(Duration::from_millis(500));
    assert_health_within(&daemon, Duration::from_secs(1));
    let closed = heads.iter_mut().map(is_closed).filter(|&c| c).count();
    assert!(closed >= 100, "only {closed} of 400 partial heads closed");
    let status = fs::read_to_string(format!("/proc/{}/status", daemon.pid())).unwrap();
    let rss_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap();
    assert!(rss_kib < 40 * 1024, "RSS {rss_kib} KiB");
}

#[test]
fn http_1_1_needs_one_valid_host_and_absolute_targets_are_accepted() {
    let daemon = builder().start();
    for (request, status) in [
        (&b"GET /health HTTP/1.1\r\n\r\n"[..], 400),
        (b"GET /health HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400),
        (b"GET /health HTTP/1.1\r\nHost: a b\r\n\r\n", 400),
        (
            b"GET http://sandbox:49983/health HTTP/1.1\r\nHost: sandbox:49983\r\n\r\n",
            204,
        ),
        (b"GET /health HTTP/1.0\r\n\r\n", 204),
        (
            b"POST /init HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            400,
        ),
    ] {
        let reply = daemon.raw(request);
        assert_eq!(reply.status, status, "{}", String::from_utf8_lossy(request));
        if status == 400 {
            assert!(reply.json()["message"].is_string());
            assert_eq!(reply.header("connection"), Some("close"));
        }
    }
    // Every refused head has its log line.
    let deadline = Instant::now() + Duration::from_secs(5);
    while daemon.log().iter().filter(|l| l.contains(" 400 ")).count() < 4 {
        assert!(Instant::now() < deadline, "{:?}", daemon.log());
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_body_refused_early_on_a_closing_connection_is_read_away_not_reset() {
    // An upload without the token, that asked to close, with 8 MiB (more than the socket
    // buffers hold) still coming: the daemon answers 401 from the head, then keeps reading what
    // the client sends, so the client's write completes and it reads the answer, not a reset.
    let daemon = builder().start();
    let body = vec![b'x'; 8 << 20];
    let head = format!(
        "POST /files?path=x HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let mut stream = daemon.connect();
    stream.write_all(head.as_bytes()).unwrap();
    stream
        .write_all(&body)
        .expect("the whole body could be sent");
    let reply = read_reply(&mut BufReader::new(stream), false).expect("the answer, not a reset");
    assert_eq!(reply.status, 401, "{}", reply.text());
    assert_eq!(reply.header("connection"), Some("close"));
}
