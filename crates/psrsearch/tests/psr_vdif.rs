//! VDIF: written frames read back exactly for every sample size, real and complex, one or
//! two polarisations; threads map to channels and polarisations as the side-car says;
//! missing frames read as zeros with a warning; and what the headers cannot give is asked
//! for by name.

use std::path::{Path, PathBuf};

use psrsearch::format::vdif::{write_vdif, VdifHeader};
use psrsearch::{BasebandFormat, BasebandReader, ReadError, Sideband, Voltages};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rustfft::num_complex::Complex32;

fn tmp(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("psr_vdif");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// The values a `bits`-bit component decodes to (so writing them loses nothing).
fn levels(bits: u32) -> Vec<f32> {
    match bits {
        1 => vec![-1.0, 1.0],
        2 => vec![-3.316505, -1.0, 1.0, 3.316505],
        4 => (0..16).map(|v| (v as f32 - 8.0) / 2.95).collect(),
        _ => (0..256).map(|v| (v as f32 - 127.5) / 35.5).collect(),
    }
}

fn random_levels(bits: u32, nchan: usize, npol: usize, n: usize, complex: bool) -> Voltages {
    let l = levels(bits);
    let mut rng = StdRng::seed_from_u64(u64::from(bits) * 7 + nchan as u64);
    let mut pick = || l[rng.gen_range(0..l.len())];
    let data = (0..nchan * npol * n)
        .map(|_| {
            let re = pick();
            Complex32::new(re, if complex { pick() } else { 0.0 })
        })
        .collect();
    Voltages::from_vec(nchan, npol, n, data)
}

fn write(path: &Path, v: &Voltages, complex: bool, bits: u32, spf: usize, rate: f64, car: &str) {
    let mut f = std::fs::File::create(path).unwrap();
    write_vdif(&mut f, v, complex, bits, spf, rate).unwrap();
    std::fs::write(format!("{}.hdr", path.display()), car).unwrap();
}

#[test]
fn every_sample_size_reads_back_exactly() {
    for bits in [1, 2, 4, 8] {
        for complex in [false, true] {
            for npol in [1, 2] {
                let (nchan, spf, rate) = (2, 512, 512.0 * 4.0);
                let v = random_levels(bits, nchan, npol, 4 * spf, complex);
                let path = tmp(&format!("rt_{bits}_{complex}_{npol}.vdif"));
                write(
                    &path,
                    &v,
                    complex,
                    bits,
                    spf,
                    rate,
                    &format!(
                        "FREQ 1400\nBW -{}\nNPOL {npol}\nSAMPLE_RATE {}\nSOURCE fake\n",
                        nchan as f64 * rate / 1e6 / if complex { 1.0 } else { 2.0 },
                        rate / 1e6
                    ),
                );
                let mut r = BasebandReader::open(&path).unwrap();
                let how = format!("{bits} bits, complex {complex}, npol {npol}");
                assert_eq!(r.format(), BasebandFormat::Vdif, "{how}");
                assert_eq!(r.nsamples(), 4 * spf as u64, "{how}");
                assert_eq!(r.nframes(), 4, "{how}");
                assert!(r.warnings().is_empty(), "{how}: {:?}", r.warnings());
                let b = r.band().clone();
                assert_eq!(
                    (b.nchan(), b.npol, b.complex),
                    (nchan, npol, complex),
                    "{how}"
                );
                assert_eq!(b.sample_rate_hz, rate, "{how}");
                assert_eq!(b.sideband, Sideband::Lower, "{how}");
                assert_eq!(r.metadata().source, "fake");
                // 2000-01-01, the epoch, at second 0.
                assert_eq!(r.metadata().start_mjd, Some(51_544.0));
                let all = r.read(0, 4 * spf).unwrap();
                assert_eq!(all.as_slice(), v.as_slice(), "{how}");
                // Pieces across frame boundaries equal the whole.
                let part = r.read(spf as u64 - 3, spf + 7).unwrap();
                for c in 0..nchan {
                    for p in 0..npol {
                        assert_eq!(
                            part.series(c, p),
                            &v.series(c, p)[spf - 3..2 * spf + 4],
                            "{how}: chan {c} pol {p}"
                        );
                    }
                }
            }
        }
    }
}

/// Frames of `path` as (offset, header).
fn frames(path: &Path) -> Vec<(usize, VdifHeader)> {
    let bytes = std::fs::read(path).unwrap();
    let mut out = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let h = VdifHeader::parse(&bytes[at..]).unwrap();
        let next = at + h.frame_bytes;
        out.push((at, h));
        at = next;
    }
    out
}

#[test]
fn missing_and_invalid_frames_read_as_zeros() {
    let (spf, rate) = (256, 256.0 * 8.0);
    let v = random_levels(8, 1, 2, 6 * spf, true);
    let path = tmp("gaps.vdif");
    write(
        &path,
        &v,
        true,
        8,
        spf,
        rate,
        &format!("FREQ 300\nNPOL 2\nSAMPLE_RATE {}\n", rate / 1e6),
    );
    // Drop the second frame set's thread 1 and mark the fourth set's thread 0 invalid.
    let bytes = std::fs::read(&path).unwrap();
    let fr = frames(&path);
    let len = fr[0].1.frame_bytes;
    let mut cut = Vec::new();
    for (k, (at, _)) in fr.iter().enumerate() {
        if k == 3 {
            continue;
        }
        let mut f = bytes[*at..at + len].to_vec();
        if k == 6 {
            f[3] |= 0x80;
        }
        cut.extend_from_slice(&f);
    }
    std::fs::write(&path, cut).unwrap();
    let mut r = BasebandReader::open(&path).unwrap();
    assert_eq!(r.nsamples(), 6 * spf as u64);
    assert!(
        r.warnings().iter().any(|w| w.contains("2 of 12 frames")),
        "{:?}",
        r.warnings()
    );
    let got = r.read(0, 6 * spf).unwrap();
    for p in 0..2 {
        for (t, (g, w)) in got.series(0, p).iter().zip(v.series(0, p)).enumerate() {
            let blank = (p == 1 && t / spf == 1) || (p == 0 && t / spf == 3);
            let want = if blank { Complex32::new(0.0, 0.0) } else { *w };
            assert_eq!(*g, want, "pol {p} sample {t}");
        }
    }
}

#[test]
fn threads_follow_the_sidecar() {
    let (spf, rate) = (128, 128.0 * 4.0);
    // Four threads: channel-major pairs of polarisations as written.
    let v = random_levels(4, 2, 2, 2 * spf, false);
    let path = tmp("threads.vdif");
    write(
        &path,
        &v,
        false,
        4,
        spf,
        rate,
        &format!("FREQ 100\nSAMPLE_RATE {}\nTHREADS 3,2,1,0\n", rate / 1e6),
    );
    let mut r = BasebandReader::open(&path).unwrap();
    // One polarisation, four channels in the order the side-car lists threads.
    assert_eq!((r.band().nchan(), r.band().npol), (4, 1));
    assert_eq!(r.band().sideband, Sideband::Upper);
    let got = r.read(0, 2 * spf).unwrap();
    for (k, thread) in [3usize, 2, 1, 0].into_iter().enumerate() {
        assert_eq!(
            got.series(k, 0),
            v.series(thread / 2, thread % 2),
            "channel {k}"
        );
    }
}

fn open_err(path: &Path) -> String {
    let e: ReadError = BasebandReader::open(path).unwrap_err();
    let mut msg = e.to_string();
    let mut src: Option<&dyn std::error::Error> = std::error::Error::source(&e);
    while let Some(s) = src {
        msg += &format!(": {s}");
        src = s.source();
    }
    msg
}

#[test]
fn what_the_headers_lack_is_asked_for() {
    let (spf, rate) = (128, 128.0 * 4.0);
    let v = random_levels(2, 1, 1, 2 * spf, false);
    let path = tmp("asks.vdif");
    write(&path, &v, false, 2, spf, rate, "FREQ 100\n");
    // Two frames within one second, EDV 0: no way to know the rate.
    let e = open_err(&path);
    assert!(
        e.contains("SAMPLE_RATE") && e.contains("asks.vdif.hdr"),
        "{e}"
    );
    std::fs::remove_file(format!("{}.hdr", path.display())).unwrap();
    let e = open_err(&path);
    assert!(e.contains("FREQ") && e.contains("asks.vdif.hdr"), "{e}");
    // A bandwidth the channels cannot span.
    std::fs::write(
        format!("{}.hdr", path.display()),
        "FREQ 100\nSAMPLE_RATE 0.000512\nBW 5\n",
    )
    .unwrap();
    let e = open_err(&path);
    assert!(e.contains("BW 5"), "{e}");
    // A thread the file lacks.
    std::fs::write(
        format!("{}.hdr", path.display()),
        "FREQ 100\nSAMPLE_RATE 0.000512\nTHREADS 4\n",
    )
    .unwrap();
    let e = open_err(&path);
    assert!(e.contains("THREADS") && e.contains('4'), "{e}");
}

#[test]
fn frame_rate_is_counted_across_a_second() {
    // Four frames a second for 2.5 seconds; EDV 0 and no SAMPLE_RATE.
    let (spf, rate) = (64, 64.0 * 4.0);
    let v = random_levels(1, 1, 1, 10 * spf, false);
    let path = tmp("count.vdif");
    write(&path, &v, false, 1, spf, rate, "FREQ 100\n");
    let mut r = BasebandReader::open(&path).unwrap();
    assert_eq!(r.band().sample_rate_hz, rate);
    assert_eq!(r.read(0, 10 * spf).unwrap().as_slice(), v.as_slice());
}

#[test]
fn damaged_files_are_refused_or_read_without_panicking() {
    let (spf, rate) = (128, 128.0 * 4.0);
    let v = random_levels(8, 1, 1, 4 * spf, true);
    let path = tmp("damaged.vdif");
    write(
        &path,
        &v,
        true,
        8,
        spf,
        rate,
        &format!("FREQ 100\nSAMPLE_RATE {}\n", rate / 1e6),
    );
    let clean = std::fs::read(&path).unwrap();
    let len = frames(&path)[0].1.frame_bytes;
    // A frame dated 2^30 - 1 seconds on: ignored, not a gap of 4e9 frame sets.
    let mut far = clean.clone();
    far[2 * len..2 * len + 4].copy_from_slice(&0x3fff_ffffu32.to_le_bytes());
    std::fs::write(&path, &far).unwrap();
    let mut r = BasebandReader::open(&path).unwrap();
    assert!(
        r.warnings().iter().any(|w| w.contains("far beyond")),
        "{:?}",
        r.warnings()
    );
    assert_eq!(r.nsamples(), 4 * spf as u64);
    let got = r.read(0, 4 * spf).unwrap();
    assert_eq!(&got.as_slice()[..2 * spf], &v.as_slice()[..2 * spf]);
    // Random bytes in every header field: an error or a reader, never a panic.
    let mut rng = StdRng::seed_from_u64(99);
    for round in 0..300 {
        let mut b = clean.clone();
        for _ in 0..1 + round % 4 {
            let frame = rng.gen_range(0..4) * len;
            let at = frame + rng.gen_range(0..32);
            b[at] = rng.gen();
        }
        std::fs::write(&path, &b).unwrap();
        if let Ok(mut r) = BasebandReader::open(&path) {
            let n = r.nsamples().min(1 << 16) as usize;
            let _ = r.read(0, n);
        }
    }
}
