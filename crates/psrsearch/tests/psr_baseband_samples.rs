//! The real telescope samples shipped with the PyPI package `baseband` (DADA, GUPPI, VDIF)
//! read exactly as `baseband` reads them (values from its own test suite). The files are
//! fetched by
//! `tests/fetch_baseband_samples.sh` into the target directory; without pip or PyPI the
//! tests say so and pass without checking (set `PSRSEARCH_REQUIRE_SAMPLES=1` to fail
//! instead, `PSRSEARCH_BASEBAND_SAMPLES=DIR` to use files already at hand).

use std::path::PathBuf;
use std::sync::OnceLock;

use psrsearch::format::guppi::GuppiHeader;
use psrsearch::{BasebandFormat, BasebandReader, ReadError, Sideband};
use rustfft::num_complex::Complex32;

fn samples() -> Option<PathBuf> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::var_os("PSRSEARCH_BASEBAND_SAMPLES")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("baseband-samples"));
        if [
            "sample_puppi.raw",
            "sample.dada",
            "sample.vdif",
            "sample_bps1.vdif",
        ]
        .iter()
        .all(|f| dir.join(f).exists())
        {
            return Some(dir);
        }
        let script =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fetch_baseband_samples.sh");
        let status = std::process::Command::new("bash")
            .arg(&script)
            .arg(&dir)
            .status();
        match status {
            Ok(s) if s.success() => Some(dir),
            other => {
                let msg = format!(
                    "SKIPPED: could not fetch the `baseband` sample files ({other:?}); \
                     run {} DIR and set PSRSEARCH_BASEBAND_SAMPLES=DIR",
                    script.display()
                );
                assert!(
                    std::env::var_os("PSRSEARCH_REQUIRE_SAMPLES").is_none(),
                    "{msg}"
                );
                eprintln!("{msg}");
                None
            }
        }
    })
    .clone()
}

fn c(re: f32, im: f32) -> Complex32 {
    Complex32::new(re, im)
}

#[test]
fn effelsberg_dada_sample() {
    let Some(dir) = samples() else { return };
    let mut r = BasebandReader::open(dir.join("sample.dada")).unwrap();
    assert_eq!(r.format(), BasebandFormat::Dada);
    let b = r.band().clone();
    assert!(b.complex);
    assert_eq!((b.npol, b.nchan()), (2, 1));
    assert_eq!(b.sample_rate_hz, 16e6);
    assert_eq!(b.centre_mhz, vec![320.0]);
    assert_eq!(b.sideband, Sideband::Upper);
    assert_eq!(r.nsamples(), 16000);
    assert_eq!(r.metadata().source, "2016+28");
    // RA 20:16:00.20, DEC 28:30:30.0; MJD_START moved on by OBS_OFFSET, 6.4e9 bytes of 4
    // per sample at 16 MHz: 100 s.
    let m = r.metadata();
    assert_eq!(m.telescope, "Effelsberg");
    let p = m.position.expect("the header gives RA and DEC");
    assert_eq!(
        (p.ra_text(), p.dec_text()),
        ("20:16:00.2000".into(), "28:30:30.0000".into())
    );
    let mjd = m.start_mjd.unwrap();
    assert!(
        (mjd - (56_475.067_824_074_074 + 100.0 / 86_400.0)).abs() < 1e-10,
        "{mjd}"
    );
    // baseband's test_dada.py: payload[:3] with shape (time, pol, chan).
    let v = r.read(0, 3).unwrap();
    let want = [
        [c(-38.0, -38.0), c(-38.0, -38.0)],
        [c(-38.0, -38.0), c(-40.0, 0.0)],
        [c(-105.0, 60.0), c(85.0, -15.0)],
    ];
    for (t, row) in want.iter().enumerate() {
        for (p, w) in row.iter().enumerate() {
            assert_eq!(v.get(0, p, t), *w, "t={t} pol={p}");
        }
    }
    // Reading in pieces equals reading at once.
    let all = r.read(0, 16000).unwrap();
    let part = r.read(9990, 12).unwrap();
    for p in 0..2 {
        assert_eq!(part.series(0, p), &all.series(0, p)[9990..10002]);
    }
    assert!(matches!(
        r.read(15990, 11),
        Err(ReadError::OutOfRange { .. })
    ));
}

#[test]
fn meerkat_dada_sample_is_real_and_truncated() {
    let Some(dir) = samples() else { return };
    let mut r = BasebandReader::open(dir.join("sample_meerkat.dada")).unwrap();
    let b = r.band().clone();
    assert!(!b.complex);
    assert_eq!((b.npol, b.nchan()), (2, 1));
    assert_eq!(b.sample_rate_hz, 800e6);
    assert_eq!((b.lowest_mhz(), b.highest_mhz()), (1200.0, 1600.0));
    // baseband: data.shape == (16384 - 4096 // 2, 2): FILE_SIZE promises more than is there.
    assert_eq!(r.nsamples(), 16384 - 4096 / 2);
    assert!(!r.warnings().is_empty());
    let p = r.metadata().position.unwrap();
    assert_eq!(
        (p.ra_text(), p.dec_text()),
        ("09:57:54.7000".into(), "68:49:00.9000".into())
    );
    let v = r.read(0, r.nsamples() as usize).unwrap();
    assert!(v.as_slice().iter().all(|z| z.im == 0.0));
    assert!(v.as_slice().iter().any(|z| z.re != 0.0));
}

#[test]
fn puppi_guppi_sample() {
    let Some(dir) = samples() else { return };
    let mut r = BasebandReader::open(dir.join("sample_puppi.raw")).unwrap();
    assert_eq!(r.format(), BasebandFormat::Guppi);
    assert_eq!(r.nframes(), 4);
    let b = r.band().clone();
    assert!(b.complex);
    assert_eq!((b.npol, b.nchan()), (2, 4));
    assert_eq!(b.sample_rate_hz, 250.0);
    // Four blocks of 1024 samples, each but the last giving 64 to the next as overlap.
    assert_eq!(r.nsamples(), 4 * 1024 - 3 * 64);
    assert_eq!(r.metadata().source, "J1810+1744");
    // RA_STR and DEC_STR rather than the rounder RA and DEC in degrees; Arecibo is
    // SIGPROC's telescope 1.
    let p = r.metadata().position.unwrap();
    assert_eq!(
        (p.ra_text(), p.dec_text()),
        ("18:10:37.2800".into(), "17:44:37.3801".into())
    );
    assert_eq!(
        psrsearch::format::sigproc::telescope_id(&r.metadata().telescope),
        1
    );
    let mjd = r.metadata().start_mjd.unwrap();
    assert!((mjd - (58132.0 + 51093.0 / 86400.0)).abs() < 1e-9, "{mjd}");
    let v = r.read(0, 3).unwrap();
    // baseband's test_guppi.py: payload[:3], shape (time, pol, chan).
    let want = [
        [
            [
                c(-7.0, 12.0),
                c(-32.0, -10.0),
                c(-17.0, 25.0),
                c(16.0, -5.0),
            ],
            [c(14.0, 21.0), c(-5.0, -7.0), c(19.0, -8.0), c(7.0, 7.0)],
        ],
        [
            [c(5.0, -3.0), c(-15.0, -14.0), c(-8.0, 14.0), c(-6.0, -18.0)],
            [c(21.0, -1.0), c(22.0, 6.0), c(-30.0, -13.0), c(12.0, 23.0)],
        ],
        [
            [c(11.0, 2.0), c(9.0, -13.0), c(9.0, -15.0), c(-21.0, -6.0)],
            [
                c(10.0, -12.0),
                c(-3.0, -10.0),
                c(-12.0, -8.0),
                c(4.0, -27.0),
            ],
        ],
    ];
    let check = |v: &psrsearch::Voltages, want: &[[[Complex32; 4]; 2]], what: &str| {
        for (t, pols) in want.iter().enumerate() {
            for (p, chans) in pols.iter().enumerate() {
                for (ch, w) in chans.iter().enumerate() {
                    assert_eq!(v.get(ch, p, t), *w, "{what}: t={t} pol={p} chan={ch}");
                }
            }
        }
    };
    check(&v, &want, "first samples");
    let v = r.read(337, 3).unwrap();
    let want = [
        [
            [c(2.0, -25.0), c(31.0, 2.0), c(-10.0, 1.0), c(-29.0, 14.0)],
            [
                c(24.0, 6.0),
                c(-23.0, -16.0),
                c(-22.0, -20.0),
                c(-11.0, -6.0),
            ],
        ],
        [
            [c(11.0, 10.0), c(-2.0, -1.0), c(-6.0, 9.0), c(19.0, 16.0)],
            [c(10.0, -25.0), c(-33.0, -5.0), c(14.0, 0.0), c(3.0, -3.0)],
        ],
        [
            [c(22.0, -7.0), c(5.0, 11.0), c(-21.0, 4.0), c(2.0, 0.0)],
            [c(-4.0, -12.0), c(1.0, 1.0), c(13.0, 6.0), c(-31.0, -4.0)],
        ],
    ];
    check(&v, &want, "samples 337..340");
    // Overlap handling: stream samples 1523..1525 are block 1's samples 563..565, and the
    // overlap at the end of block 0 equals the start of block 1.
    let all = r.read(0, r.nsamples() as usize).unwrap();
    let bytes = std::fs::read(dir.join("sample_puppi.raw")).unwrap();
    let (h, _) = GuppiHeader::read_from(&mut bytes.as_slice())
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(h.nbytes(), 6400);
    let frame_bytes = h.nbytes() + 16384;
    let block1 = &bytes[frame_bytes + h.nbytes()..2 * frame_bytes];
    for t in [563usize, 564] {
        for ch in 0..4 {
            for p in 0..2 {
                let at = ch * 1024 * 4 + t * 4 + p * 2;
                let want = c(block1[at] as i8 as f32, block1[at + 1] as i8 as f32);
                assert_eq!(all.get(ch, p, 960 + t), want);
            }
        }
    }
    // The samples where block 0 overlaps block 1 come from block 1 (as in baseband).
    for t in 0..64 {
        let at = 2 * 1024 * 4 + t * 4;
        assert_eq!(
            all.get(2, 0, 960 + t),
            c(block1[at] as i8 as f32, block1[at + 1] as i8 as f32)
        );
    }
}

#[test]
fn header_only_guppi_samples() {
    let Some(dir) = samples() else { return };
    // Breakthrough Listen: DIRECTIO pads the header to 7168 bytes; the file has no payload.
    let bytes = std::fs::read(dir.join("sample_blc.raw")).unwrap();
    let (h, _) = GuppiHeader::read_from(&mut bytes.as_slice())
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(h.nbytes(), 7168);
    let p = h.params().unwrap();
    assert!(p.directio);
    assert_eq!((p.nchan, p.npol), (64, 2));
    assert!(matches!(
        BasebandReader::open(dir.join("sample_blc.raw")),
        Err(ReadError::Truncated { .. })
    ));
    // VEGAS writes numbers as quoted strings; lower sideband; payload cut short.
    let bytes = std::fs::read(dir.join("sample_vegas.raw")).unwrap();
    let (h, _) = GuppiHeader::read_from(&mut bytes.as_slice())
        .unwrap()
        .unwrap()
        .unwrap();
    let p = h.params().unwrap();
    assert_eq!((p.nchan, p.npol, p.overlap), (32, 2, 512));
    assert_eq!(p.blocsize, 132_186_112);
    assert_eq!(p.band().sideband, Sideband::Lower);
    let e = BasebandReader::open(dir.join("sample_vegas.raw")).unwrap_err();
    assert!(e.to_string().contains("truncated"), "{e}");
}

#[test]
fn dedisperse_the_dada_sample() {
    let Some(dir) = samples() else { return };
    let mut r = BasebandReader::open(dir.join("sample.dada")).unwrap();
    // At 320 MHz a 16 MHz band smears by 1.6 ms per unit DM, longer than the file beyond
    // DM ~0.01; dedisperse at a small DM to exercise the whole path on real data.
    let cfg = psrsearch::PlanConfig::default().fft_len(4096);
    let out =
        psrsearch::products::dedisperse_file(&mut r, 0.005, &cfg, true, &mut |_, _| {}).unwrap();
    let (start, v) = out.voltages.as_ref().unwrap();
    assert_eq!((v.nchan(), v.npol()), (1, 2));
    assert!(v.nsamp() > 8000);
    let power: f64 = v
        .as_slice()
        .iter()
        .map(|z| z.norm_sqr() as f64)
        .sum::<f64>()
        / v.as_slice().len() as f64;
    let raw = r.read(*start as u64, v.nsamp()).unwrap();
    let raw_power: f64 = raw
        .as_slice()
        .iter()
        .map(|z| z.norm_sqr() as f64)
        .sum::<f64>()
        / raw.as_slice().len() as f64;
    // An all-pass filter keeps the power of the same stretch (up to its ~300-sample smear).
    assert!(
        (power / raw_power - 1.0).abs() < 0.01,
        "{power} vs {raw_power}"
    );
    // Its products say where and when: SIGPROC's Effelsberg is telescope 8, and RA/Dec
    // are packed as hhmmss.s; PRESTO's .inf names the telescope and writes the position.
    let base = dir.join("sample_dedispersed");
    out.write_fil(&base.with_extension("fil")).unwrap();
    let (h, _) = psrsearch::format::sigproc::read_sigproc(
        &mut std::fs::File::open(base.with_extension("fil")).unwrap(),
    )
    .unwrap();
    assert_eq!((h.telescope_id, h.source_name.as_str()), (8, "2016+28"));
    let p = h.position.expect("src_raj and src_dej");
    assert_eq!(
        (p.ra_text(), p.dec_text()),
        ("20:16:00.2000".into(), "28:30:30.0000".into())
    );
    assert!(
        (p.sigproc().0 - 201_600.2).abs() < 1e-6,
        "{:?}",
        p.sigproc()
    );
    assert!((h.tstart_mjd - out.start_mjd()).abs() < 1e-12);
    assert!(h.tstart_mjd > 56_475.068_98, "{}", h.tstart_mjd);
    out.write_presto(&base).unwrap();
    let (inf, _) = psrsearch::format::presto::read_dat_inf(&base).unwrap();
    assert_eq!(
        (inf.telescope.as_str(), inf.ra.as_str(), inf.dec.as_str()),
        ("Effelsberg", "20:16:00.2000", "28:30:30.0000")
    );
    // The detected series is that power, summed over polarisations, downsampled by one.
    let series_mean =
        out.series.data.iter().map(|v| *v as f64).sum::<f64>() / out.series.data.len() as f64;
    assert!(
        (series_mean / (2.0 * power) - 1.0).abs() < 1e-3,
        "{series_mean} vs {power}"
    );
}

/// 2-bit levels as `baseband` gives them, from the integers its tests write.
fn two_bit(v: &[i32]) -> Vec<Complex32> {
    v.iter()
        .map(|&x| {
            let level = match x {
                3 => 3.316505,
                -3 => -3.316505,
                _ => x as f32,
            };
            c(level, 0.0)
        })
        .collect()
}

#[test]
fn vlba_vdif_sample() {
    let Some(dir) = samples() else { return };
    let path = dir.join("sample.vdif");
    std::fs::write(dir.join("sample.vdif.hdr"), "FREQ 320\nSOURCE vlba\n").unwrap();
    let mut r = BasebandReader::open(&path).unwrap();
    assert_eq!(r.format(), BasebandFormat::Vdif);
    let b = r.band().clone();
    // EDV 3: 8 threads of one real 2-bit channel at 32 MHz (baseband's test_vdif.py).
    assert_eq!((b.nchan(), b.npol, b.complex), (8, 1, false));
    assert_eq!(b.sample_rate_hz, 32e6);
    assert_eq!(r.nsamples(), 40_000);
    assert_eq!(r.nframes(), 2);
    assert!(r.warnings().is_empty(), "{:?}", r.warnings());
    let mjd = r.metadata().start_mjd.unwrap();
    assert_eq!(mjd.floor(), 56_824.0);
    assert_eq!(((mjd - 56_824.0) * 86_400.0).round(), 21_367.0);
    let v = r.read(0, 12).unwrap();
    let want = [
        (0, [-1, -1, 3, -1, 1, -1, 3, -1, 1, 3, -1, 1]),
        (1, [1, 1, 1, -3, 1, 1, -3, -3, -3, 3, 3, -1]),
        (3, [-1, 1, -1, 1, -3, -1, 3, -1, 3, -3, 1, 3]),
    ];
    for (thread, w) in want {
        assert_eq!(v.series(thread, 0), &two_bit(&w)[..], "thread {thread}");
    }
    // The second frame set continues the first.
    let all = r.read(0, 40_000).unwrap();
    let part = r.read(19_990, 20).unwrap();
    assert_eq!(part.series(5, 0), &all.series(5, 0)[19_990..20_010]);
}

#[test]
fn one_bit_vdif_sample() {
    let Some(dir) = samples() else { return };
    let path = dir.join("sample_bps1.vdif");
    // EDV 0 gives no rate and the file spans less than a second: the side-car says it.
    std::fs::write(
        dir.join("sample_bps1.vdif.hdr"),
        "FREQ 1000\nSAMPLE_RATE 8\n",
    )
    .unwrap();
    let mut r = BasebandReader::open(&path).unwrap();
    let b = r.band().clone();
    assert_eq!((b.nchan(), b.npol, b.complex), (16, 1, false));
    assert_eq!(r.nsamples(), 8000);
    let v = r.read(0, 4).unwrap();
    // baseband's TestVDIFBPS1::test_stream, rows of (time, channel).
    let want = [
        [1, -1, -1, -1, 1, -1, -1, 1, -1, 1, -1, 1, -1, -1, -1, 1],
        [-1, -1, 1, -1, 1, 1, -1, 1, -1, -1, 1, -1, 1, 1, -1, 1],
        [1, 1, -1, -1, 1, 1, 1, 1, 1, -1, 1, 1, -1, 1, 1, 1],
        [1, -1, 1, -1, 1, 1, 1, -1, 1, -1, 1, 1, 1, -1, -1, -1],
    ];
    for (t, row) in want.iter().enumerate() {
        for (ch, &x) in row.iter().enumerate() {
            assert_eq!(v.get(ch, 0, t), c(x as f32, 0.0), "t={t} chan={ch}");
        }
    }
    let all = r.read(0, 8000).unwrap();
    assert!(all
        .as_slice()
        .iter()
        .all(|z| z.re.abs() == 1.0 && z.im == 0.0));
}
