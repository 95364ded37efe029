//! Baseband input, as `psrsearch` takes it from files and from the network: PSRDADA,
//! GUPPI RAW and VDIF streams (stdin, `--listen`) and files, with any headers, side-car
//! text and payload. Reading must end in samples or a `ReadError`, never a panic, a hang
//! or an allocation the input alone decides.
//!
//! Input: byte 0 picks the path (stream or file) and the format the caller names;
//! byte 1 is the length of a VDIF side-car text that follows; the rest is the stream.
#![no_main]

use std::io::Cursor;

use libfuzzer_sys::fuzz_target;
use psrsearch::format::stream::{BasebandStream, StreamFormat};
use psrsearch::{BasebandReader, Voltages};

/// Samples asked for per read, as a reader of blocks would (a few reads per input).
const BLOCK: usize = 1000;

fuzz_target!(|data: &[u8]| {
    let [sel, car_len, rest @ ..] = data else {
        return;
    };
    let (car, bytes) = rest.split_at((*car_len as usize).min(rest.len()));
    let car = String::from_utf8_lossy(car);
    if sel & 0x80 == 0 {
        stream(*sel, &car, bytes);
    } else {
        file(&car, bytes);
    }
});

fn stream(sel: u8, car: &str, bytes: &[u8]) {
    let format = match sel % 4 {
        0 => StreamFormat::Auto,
        1 => StreamFormat::Dada,
        2 => StreamFormat::Guppi,
        _ => StreamFormat::Vdif,
    };
    let car = (sel & 0x40 == 0).then_some(car);
    let Ok(mut s) = BasebandStream::open(Cursor::new(bytes), "<fuzz>", format, car) else {
        return;
    };
    let (nchan, npol) = (s.band().nchan(), s.band().npol);
    let mut out = Voltages::zeros(nchan, npol, BLOCK);
    // Every read consumes input or ends the stream; the bound only keeps a run short.
    for _ in 0..64 {
        if !matches!(s.read_samples(&mut out, 0, BLOCK), Ok(BLOCK)) {
            break;
        }
    }
    let _ = (s.samples_read(), s.repairs());
}

fn file(car: &str, bytes: &[u8]) {
    // One file per fuzzing process: libFuzzer's workers are processes.
    let dir = std::env::temp_dir().join(format!("metampi-fuzz-baseband-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let path = dir.join("input.raw");
    if std::fs::write(&path, bytes).is_err()
        || std::fs::write(psrsearch::format::vdif::VdifSidecar::path_of(&path), car).is_err()
    {
        return;
    }
    let Ok(mut r) = BasebandReader::open(&path) else {
        return;
    };
    let total = r.nsamples();
    let len = total.min(BLOCK as u64) as usize;
    let mut start = 0;
    while start + len as u64 <= total && len > 0 && start < 64 * BLOCK as u64 {
        if r.read(start, len).is_err() {
            break;
        }
        start += len as u64;
    }
    let _ = (r.header_text(), r.warnings(), r.metadata(), r.nframes());
}
