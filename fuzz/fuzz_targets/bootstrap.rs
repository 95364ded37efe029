//! The line protocols of start-up: PMI requests as the key-value server parses and
//! answers them (over a real connection), PMI replies as the client parses them, the
//! router spec line and the router's ready line. Nothing may panic or hang; every
//! complete request line gets exactly one reply line.
//!
//! Input: server-side lines, then optionally a NUL byte and the client-side replies.
#![no_main]

use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use metampi_launch::router_spec::{read_ready, RouterSpec};
use metampi_launch::pmi::{JobId, PmiClient, PmiServer, Request};

const JOB: JobId = JobId(0x0123_4567_89ab_cdef);

fuzz_target!(|data: &[u8]| {
    let (lines, replies) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], Some(&data[i + 1..])),
        None => (data, None),
    };
    let text = String::from_utf8_lossy(lines);
    for line in text.split('\n') {
        let _ = Request::parse(line);
        let _ = RouterSpec::parse(line);
    }
    if let Ok(spec) = RouterSpec::parse(&text) {
        let _ = RouterSpec::parse(&spec.to_line());
    }
    let _ = read_ready(&mut &lines[..]);
    server(lines);
    if let Some(replies) = replies {
        client(replies);
    }
});

/// One connection to a one-rank server: HELLO first when the input starts with an odd
/// byte (so the rest reaches the commands behind it), then the input.
fn server(lines: &[u8]) {
    let server = PmiServer::start(1, JOB).expect("server");
    let mut s = TcpStream::connect(server.addr()).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut sent = Vec::new();
    if lines.first().is_some_and(|b| b & 1 == 1) {
        sent.extend_from_slice(format!("HELLO {JOB} 0\n").as_bytes());
    }
    sent.extend_from_slice(lines);
    let _ = s.write_all(&sent);
    let _ = s.shutdown(Shutdown::Write);
    // One reply per complete line, unless a line too long ends the connection first.
    let want = sent.iter().filter(|&&b| b == b'\n').count();
    let mut r = BufReader::new(s);
    let mut reply = Vec::new();
    for _ in 0..want {
        reply.clear();
        match r.read_until(b'\n', &mut reply) {
            Ok(0) => break,
            Ok(_) => assert!(
                reply.starts_with(b"OK")
                    || reply.starts_with(b"ERR ")
                    || reply.starts_with(b"CHALLENGE ")
                    || reply.starts_with(b"VAL ")
                    || reply.starts_with(b"NONE"),
                "bad reply {:?}",
                String::from_utf8_lossy(&reply)
            ),
            Err(e) => panic!("no reply from the server: {e}"),
        }
    }
    drop(server);
}

/// A fake server that answers whatever the client says with the input, in order.
fn client(replies: &[u8]) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let replies = replies.to_vec();
    let fake = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().expect("accept");
        let _ = s.write_all(&replies);
        let _ = s.shutdown(Shutdown::Write);
        // Read until the client hangs up, so it never sees a reset.
        let _ = std::io::copy(&mut s, &mut std::io::sink());
    });
    if let Ok(mut c) = PmiClient::connect(addr, JOB, 0) {
        let _ = c.get("key");
        let _ = c.put("key", "value");
        let _ = c.fence();
        let _ = c.abort(3, "bye");
        let _ = c.request("GET other");
        let _ = c.finalize();
    }
    fake.join().expect("fake server");
}
