//! The HTTP layer against the real binary: framing, keep-alive, pipelining, limits, timeouts.

use std::io::{BufReader, Read, Write};
use std::time::{Duration, Instant};

use crate::common::*;

#[test]
fn every_response_has_date_and_server() {
    let daemon = start();
    for reply in [
        daemon.get("/health"),
        daemon.get("/nope"),
        daemon.call("DELETE", "/envs", b""),
    ] {
        assert_eq!(reply.header("server"), Some("sandboxd/0.1.0"));
        let date = reply.header("date").expect("Date");
        assert!(date.ends_with(" GMT") && date.len() == 29, "{date}");
    }
}

#[test]
fn keep_alive_serves_several_requests_on_one_connection() {
    let daemon = start();
    let stream = daemon.connect();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    for _ in 0..3 {
        writer
            .write_all(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
            .unwrap();
        let reply = read_reply(&mut reader, false).unwrap();
        assert_eq!(reply.status, 204);
        assert_eq!(reply.header("connection"), None);
    }
}

#[test]
fn pipelined_requests_are_answered_in_order() {
    let daemon = start();
    let mut stream = daemon.connect();
    let token = format!("X-Access-Token: {TOKEN}\r\n");
    let request = format!(
        "GET /health HTTP/1.1\r\nHost: t\r\n\r\nGET /nope HTTP/1.1\r\nHost: t\r\n\r\n\
         POST /init HTTP/1.1\r\nHost: t\r\n{token}Content-Length: 2\r\n\r\n{{}}\
         GET /envs HTTP/1.1\r\nHost: t\r\nConnection: close\r\n{token}\r\n"
    );
    stream.write_all(request.as_bytes()).unwrap();
    let mut reader = BufReader::new(stream);
    let statuses: Vec<u16> = (0..4)
        .map(|_| read_reply(&mut reader, false).unwrap().status)
        .collect();
    assert_eq!(statuses, [204, 404, 204, 200]);
    assert!(
        read_reply(&mut reader, false).is_none(),
        "closed after Connection: close"
    );
}

#[test]
fn http_1_0_closes_unless_keep_alive_is_asked() {
    let daemon = start();
    let reply = daemon.raw(b"GET /health HTTP/1.0\r\n\r\n");
    assert_eq!(reply.status, 204);
    assert_eq!(reply.header("connection"), Some("close"));

    let stream = daemon.connect();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    for _ in 0..2 {
        writer
            .write_all(b"GET /health HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
            .unwrap();
        let reply = read_reply(&mut reader, false).unwrap();
        assert_eq!(reply.header("connection"), Some("keep-alive"));
    }
}

#[test]
fn head_gets_headers_only() {
    let daemon = start();
    let stream = daemon.connect();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    let envs = format!("HEAD /envs HTTP/1.1\r\nHost: t\r\nX-Access-Token: {TOKEN}\r\n\r\n");
    writer.write_all(envs.as_bytes()).unwrap();
    let head = read_reply(&mut reader, true).unwrap();
    assert_eq!(head.status, 200);
    let length: usize = head.header("content-length").unwrap().parse().unwrap();
    assert!(length > 2);
    // The next response starts right after the head: no body bytes were sent.
    writer
        .write_all(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    assert_eq!(read_reply(&mut reader, false).unwrap().status, 204);
}

#[test]
fn expect_100_continue_is_answered_when_the_body_is_read() {
    let daemon = start();
    let stream = daemon.connect();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    let head = format!(
        "POST /init HTTP/1.1\r\nHost: t\r\nX-Access-Token: {TOKEN}\r\nExpect: 100-continue\r\n\
         Content-Type: application/json\r\nContent-Length: 26\r\n\r\n"
    );
    writer.write_all(head.as_bytes()).unwrap();
    let interim = read_reply(&mut reader, false).unwrap();
    assert_eq!(interim.status, 100);
    writer.write_all(br#"{"envVars":{"A":"b"}}     "#).unwrap();
    assert_eq!(read_reply(&mut reader, false).unwrap().status, 204);
}

#[test]
fn expect_100_continue_is_not_answered_when_the_body_is_refused() {
    let daemon = start();
    let stream = daemon.connect();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    writer
        .write_all(b"POST /nope HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 5000000\r\n\r\n")
        .unwrap();
    let reply = read_reply(&mut reader, false).unwrap();
    reply.assert_error(404, "no route for POST /nope");
    assert_eq!(reply.header("connection"), Some("close"));
}

#[test]
fn hostile_content_length_without_body_gets_an_answer() {
    let daemon = start();
    for length in ["100000000000", "18446744073709551615"] {
        for (method, target, status) in [
            ("GET", "/health", 204),
            ("GET", "/envs", 200),
            ("POST", "/nope", 404),
            ("POST", "/init", 413),
        ] {
            let request = format!(
                "{method} {target} HTTP/1.1\r\nHost: t\r\nX-Access-Token: {TOKEN}\r\nContent-Length: {length}\r\n\r\n"
            );
            let reply = daemon.raw(request.as_bytes());
            assert_eq!(reply.status, status, "{method} {target} {length}");
            assert_eq!(reply.header("connection"), Some("close"));
        }
    }
    assert_eq!(daemon.get("/health").status, 204);
}

#[test]
fn chunked_request_bodies_are_decoded() {
    let daemon = start();
    let body = r#"{"envVars":{"CHUNKED":"yes"}}"#;
    let (a, b) = body.split_at(10);
    let request = format!(
        "POST /init HTTP/1.1\r\nHost: t\r\nX-Access-Token: {TOKEN}\r\nTransfer-Encoding: chunked\r\n\r\n\
         {:x}\r\n{a}\r\n{:x};ext=1\r\n{b}\r\n0\r\n\r\n",
        a.len(),
        b.len()
    );
    assert_eq!(daemon.raw(request.as_bytes()).status, 204);
    assert_eq!(daemon.get("/envs").json()["CHUNKED"], "yes");
}

#[test]
fn malformed_framing_is_refused_with_json() {
    let daemon = start();
    let cases: [(&[u8], u16, &str); 4] = [
        (
            b"POST /init HTTP/1.1\r\nHost: t\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
            400,
            "both Content-Length and Transfer-Encoding sent",
        ),
        (
            b"POST /init HTTP/1.1\r\nHost: t\r\nContent-Length: -1\r\n\r\n",
            400,
            "invalid Content-Length header",
        ),
        (
            b"POST /init HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip\r\n\r\n",
            501,
            "unsupported Transfer-Encoding: only chunked is accepted",
        ),
        (
            b"GET / HTTP/9.9\r\n\r\n",
            400,
            "malformed request: unsupported HTTP version",
        ),
    ];
    for (request, status, message) in cases {
        daemon.raw(request).assert_error(status, message);
    }
    let bad_chunk = format!(
        "POST /init HTTP/1.1\r\nHost: t\r\nX-Access-Token: {TOKEN}\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"
    );
    let reply = daemon.raw(bad_chunk.as_bytes());
    assert_eq!(reply.status, 400);
    assert!(reply.json()["message"]
        .as_str()
        .unwrap()
        .contains("invalid chunk size"));
    assert_eq!(daemon.get("/health").status, 204);
}

#[test]
fn oversized_heads_get_431() {
    let daemon = start();
    let mut big = b"GET /health HTTP/1.1\r\nX-Big: ".to_vec();
    big.resize(80 * 1024, b'a');
    big.extend_from_slice(b"\r\n\r\n");
    let message = "request head too large: at most 64 KiB and 100 header fields";
    daemon.raw(&big).assert_error(431, message);
    let mut many = b"GET /health HTTP/1.1\r\n".to_vec();
    for i in 0..101 {
        many.extend_from_slice(format!("X-{i}: v\r\n").as_bytes());
    }
    many.extend_from_slice(b"\r\n");
    daemon.raw(&many).assert_error(431, message);
    assert_eq!(daemon.get("/health").status, 204);
}

#[test]
fn garbage_on_the_port_is_refused_and_service_goes_on() {
    let daemon = start();
    let reply = daemon.raw(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03garbage\r\n\r\n");
    assert_eq!(reply.status, 400);
    assert_eq!(daemon.get("/health").status, 204);
}

#[test]
fn slowloris_is_closed_at_the_header_timeout() {
    let daemon = builder().arg("--header-timeout").arg("1").start();
    let mut stream = daemon.connect();
    let started = Instant::now();
    stream.write_all(b"GET /health HTTP/1.1\r\n").unwrap();
    let mut closed = false;
    for _ in 0..40 {
        std::thread::sleep(Duration::from_millis(100));
        if stream.write_all(b"X").is_err() {
            closed = true;
            break;
        }
    }
    let mut rest = Vec::new();
    let read = stream.read_to_end(&mut rest);
    assert!(
        closed || matches!(read, Ok(0) | Err(_)),
        "still open after 4 s"
    );
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(4),
        "{took:?}"
    );
    assert_eq!(daemon.get("/health").status, 204);
}

#[test]
fn silent_connections_are_closed_at_the_header_timeout() {
    let daemon = builder().arg("--header-timeout").arg("0.5").start();
    let mut stream = daemon.connect();
    let started = Instant::now();
    let mut buf = [0u8; 1];
    assert_eq!(stream.read(&mut buf).unwrap_or(0), 0);
    assert!(started.elapsed() < Duration::from_secs(3));
}

#[test]
fn idle_keep_alive_connections_are_closed_at_the_idle_timeout() {
    let daemon = builder().arg("--idle-timeout").arg("0.5").start();
    let stream = daemon.connect();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    (&stream)
        .write_all(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    assert_eq!(read_reply(&mut reader, false).unwrap().status, 204);
    let started = Instant::now();
    let mut rest = Vec::new();
    assert_eq!(reader.read_to_end(&mut rest).unwrap_or(0), 0);
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(400) && took < Duration::from_secs(3),
        "{took:?}"
    );
}

#[test]
fn busy_clients_are_served_while_many_idle_connections_are_open() {
    let daemon = start();
    let idle: Vec<_> = (0..200).map(|_| daemon.connect()).collect();
    let took = busy_keep_alive_clients(&daemon, 64, 5);
    assert!(took < Duration::from_secs(2), "64 clients took {took:?}");
    drop(idle);
}

#[test]
fn a_flood_past_the_open_file_limit_does_not_stop_the_acceptor() {
    // The hard limit caps what sandboxd can raise its soft limit to.
    let daemon = builder()
        .wrap_with_shell("ulimit -Sn 64 && ulimit -Hn 64 && exec")
        .start();
    let flood: Vec<_> = (0..150)
        .filter_map(|_| std::net::TcpStream::connect(daemon.addr).ok())
        .collect();
    daemon.log_with(|l| l.contains("accept failed"));
    // Idle connections are closed first to make room, so a new client is served even now.
    assert_eq!(daemon.get("/health").status, 204);
    drop(flood);
    std::thread::sleep(Duration::from_millis(200));
    for _ in 0..20 {
        assert_eq!(daemon.get("/health").status, 204);
    }
}

#[test]
fn unfinished_heads_past_the_open_file_limit_are_closed_oldest_first() {
    // Every connection sends a head's first bytes, so none is idle; the header timeout is long,
    // so none ends by itself while the test runs.
    let daemon = builder()
        .wrap_with_shell("ulimit -Sn 64 && ulimit -Hn 64 && exec")
        .args(&["--header-timeout", "120"])
        .start();
    let mut flood = Vec::new();
    for _ in 0..150 {
        let Ok(mut stream) = std::net::TcpStream::connect(daemon.addr) else {
            break;
        };
        let _ = stream.write_all(b"GET /health HTTP/1.1\r\nHo");
        flood.push(stream);
    }
    daemon.log_with(|l| l.contains("accept failed"));
    // The oldest unfinished heads are closed to make room, so a new client is served.
    for _ in 0..5 {
        assert_health_within(&daemon, Duration::from_secs(3));
    }
    // The first connections were the ones closed: their heads' ends go nowhere.
    let mut first = flood.remove(0);
    first
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let _ = first.write_all(b"st: t\r\n\r\n");
    let mut buf = [0u8; 1];
    assert!(matches!(first.read(&mut buf), Ok(0) | Err(_)));
}

#[test]
fn a_withheld_body_holds_no_worker_and_everyone_else_is_answered() {
    // One worker; a request whose body never comes waits in the event loop, not in the worker,
    // so 300 other clients are all answered, and the withheld body still completes later.
    let daemon = builder().arg("--workers").arg("1").start();
    let mut holder = daemon.connect();
    let head = format!(
        "POST /init HTTP/1.1\r\nHost: t\r\nX-Access-Token: {TOKEN}\r\nContent-Length: 10\r\n\r\n{{"
    );
    holder.write_all(head.as_bytes()).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let waiting: Vec<_> = (0..300)
        .map(|_| {
            let mut stream = daemon.connect();
            stream
                .write_all(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
                .unwrap();
            stream
        })
        .collect();
    for stream in waiting {
        let reply = read_reply(&mut BufReader::new(stream), false).expect("every client answered");
        assert_eq!(reply.status, 204);
    }
    holder.write_all(b"}        ").unwrap();
    let reply = read_reply(&mut BufReader::new(holder), false).expect("the holder answered");
    assert_eq!(reply.status, 204, "{}", reply.text());
}

#[test]
fn every_request_line_is_written_in_order_by_a_clean_stop() {
    // Request lines are buffered per worker (src/log/buffer.rs): none may be lost or reordered.
    let mut daemon = start();
    let clients: Vec<_> = (0..4)
        .map(|client| {
            let stream = daemon.connect();
            std::thread::spawn(move || {
                let mut requests = Vec::new();
                for n in 0..250 {
                    requests.extend_from_slice(
                        format!("GET /health?c={client}&n={n} HTTP/1.1\r\nHost: t\r\n\r\n")
                            .as_bytes(),
                    );
                }
                let mut writer = stream.try_clone().unwrap();
                writer.write_all(&requests).unwrap();
                let mut reader = BufReader::new(stream);
                for _ in 0..250 {
                    assert_eq!(read_reply(&mut reader, false).unwrap().status, 204);
                }
                // Kept open: the daemon stops with these connections idle.
                reader
            })
        })
        .collect();
    let _open: Vec<_> = clients.into_iter().map(|c| c.join().unwrap()).collect();
    daemon.signal("TERM");
    assert!(daemon.wait(Duration::from_secs(10)).is_some());
    let log = daemon.log_with(|line| line.contains("drained; exiting"));
    for client in 0..4 {
        let tag = format!("GET /health?c={client}&n=");
        let numbers: Vec<usize> = log
            .iter()
            .filter_map(|line| line.split(&tag).nth(1))
            .map(|rest| rest.split(' ').next().unwrap().parse().unwrap())
            .collect();
        assert_eq!(numbers, (0..250).collect::<Vec<_>>(), "client {client}");
    }
}
