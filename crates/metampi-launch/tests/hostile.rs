//! Hostile and broken input to the bootstrap protocol, seeded: random and mutated
//! request lines through the parser and through a running server (every complete line
//! gets exactly one well-formed reply, and the server keeps serving), and random replies
//! to a client (every call returns, with an error where the reply makes no sense). The
//! open-ended search is the `bootstrap` target in `fuzz/`.

use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::time::Duration;

use metampi_launch::pmi::{JobId, PmiClient, PmiServer, Request};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const JOB: JobId = JobId(0x0123_4567_89ab_cdef);

const VALID: &[&str] = &[
    "HELLO 0123456789abcdef 0",
    "PUT key value",
    "GET key",
    "FENCE",
    "ABORT 3 something went wrong",
    "FINALIZE",
];

fn mutate(rng: &mut StdRng, line: &str) -> Vec<u8> {
    let mut b = line.as_bytes().to_vec();
    for _ in 0..rng.gen_range(1..4) {
        let at = rng.gen_range(0..=b.len());
        match rng.gen_range(0..5) {
            0 if at < b.len() => b[at] = rng.gen(),
            1 => b.insert(at, *b" \t\r\x00\xff-9".get(rng.gen_range(0..7)).unwrap()),
            2 if at < b.len() => {
                b.remove(at);
            }
            3 => {
                let digits: Vec<u8> = (0..rng.gen_range(1..25))
                    .map(|_| b"0123456789abcdef"[rng.gen_range(0..16)])
                    .collect();
                b.splice(at..at, digits);
            }
            _ => {
                let other = VALID[rng.gen_range(0..VALID.len())].as_bytes();
                b.splice(at..at, other.iter().copied());
            }
        }
    }
    b.retain(|&c| c != b'\n');
    b
}

fn random_line(rng: &mut StdRng) -> Vec<u8> {
    let n = rng.gen_range(0..60);
    (0..n).map(|_| rng.gen()).filter(|&c| c != b'\n').collect()
}

#[test]
fn parser_refuses_random_and_mutated_lines() {
    let mut rng = StdRng::seed_from_u64(11);
    let mut refused = 0;
    for i in 0..4000 {
        let line = if i % 2 == 0 {
            random_line(&mut rng)
        } else {
            mutate(&mut rng, VALID[i % VALID.len()])
        };
        let text = String::from_utf8_lossy(&line);
        if let Err(e) = Request::parse(&text) {
            refused += 1;
            assert!(!e.to_string().contains('\n'), "{e}");
        }
    }
    assert!(refused > 2000, "only {refused} of 4000 refused");
}

/// Sends `lines` on one connection and returns the replies.
fn talk(server: &PmiServer, lines: &[Vec<u8>], hello: bool) -> Vec<String> {
    let mut s = TcpStream::connect(server.addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut sent = Vec::new();
    if hello {
        sent.extend_from_slice(format!("HELLO {JOB} 0\n").as_bytes());
    }
    for l in lines {
        sent.extend_from_slice(l);
        sent.push(b'\n');
    }
    s.write_all(&sent).unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    let want = sent.iter().filter(|&&b| b == b'\n').count();
    let mut r = BufReader::new(s);
    let mut replies = Vec::new();
    for _ in 0..want {
        let mut reply = String::new();
        r.read_line(&mut reply).expect("a reply to every line");
        replies.push(reply);
    }
    replies
}

#[test]
fn server_answers_every_hostile_line() {
    let mut rng = StdRng::seed_from_u64(12);
    for round in 0..40 {
        // One rank, so FENCE never waits; a fresh server, so HELLO is possible again.
        let server = PmiServer::start(1, JOB).unwrap();
        let lines: Vec<Vec<u8>> = (0..50)
            .map(|i| {
                if i % 3 == 0 {
                    random_line(&mut rng)
                } else {
                    let base = VALID[rng.gen_range(0..VALID.len())];
                    mutate(&mut rng, base)
                }
            })
            .collect();
        let replies = talk(&server, &lines, round % 2 == 0);
        for r in &replies {
            assert!(
                r == "OK\n" || r == "NONE\n" || r.starts_with("ERR ") || r.starts_with("VAL "),
                "bad reply {r:?}"
            );
        }
        // Still serving: a well-behaved exchange on a new connection works.
        let again = talk(&server, &[b"FENCE".to_vec()], false);
        assert!(again[0].starts_with("ERR "), "{again:?}");
    }
}

#[test]
fn client_survives_hostile_replies() {
    let mut rng = StdRng::seed_from_u64(13);
    let replies = [
        "OK", "ERR no", "VAL x", "NONE", "VAL", "ok", "OK OK", "\u{fffd}",
    ];
    for _ in 0..150 {
        let mut blob = Vec::new();
        for _ in 0..rng.gen_range(0..8) {
            if rng.gen_bool(0.7) {
                blob.extend_from_slice(replies[rng.gen_range(0..replies.len())].as_bytes());
            } else {
                blob.extend(random_line(&mut rng));
            }
            if rng.gen_bool(0.9) {
                blob.push(b'\n');
            }
        }
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let fake = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let _ = s.write_all(&blob);
            let _ = s.shutdown(Shutdown::Write);
            let _ = std::io::copy(&mut s, &mut std::io::sink());
        });
        if let Ok(mut c) = PmiClient::connect(addr, JOB, 0) {
            let _ = c.get("key");
            let _ = c.put("key", "value");
            let _ = c.fence();
            let _ = c.abort(1, "x");
            let _ = c.finalize();
        }
        fake.join().unwrap();
    }
}
