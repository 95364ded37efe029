//! Every writer round-trips through its reader; baseband readers handle the layouts and the
//! broken files they must reject with a clear error.

use std::io::Write;
use std::path::PathBuf;

use psrsearch::format::dada::{write_dada, DadaHeader};
use psrsearch::format::guppi::{write_guppi, write_guppi_as, GuppiHeader};
use psrsearch::format::presto::{read_dat_inf, write_dat_inf, InfFile};
use psrsearch::format::sigproc::{read_sigproc, write_fil, write_tim, SigprocHeader};
use psrsearch::format::stream::{BasebandStream, StreamFormat};
use psrsearch::format::{candidates, npy, Metadata, SampleFormat, SkyPosition};
use psrsearch::search::Candidate;
use psrsearch::{BasebandReader, HeaderError, ReadError, Sideband, Voltages};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rustfft::num_complex::Complex32;

fn tmp(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("psr_formats");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// All of a baseband stream, read in chunks of `chunk` samples (across block edges), with
/// what it had to repair.
fn stream_all(bytes: &[u8], chunk: usize) -> (Voltages, Vec<String>) {
    let mut s = BasebandStream::open(bytes, "<test>", StreamFormat::Auto, None).unwrap();
    let b = s.band().clone();
    let (nchan, npol) = (b.nchan(), b.npol);
    let mut parts: Vec<Voltages> = Vec::new();
    loop {
        let mut out = Voltages::zeros(nchan, npol, chunk);
        let got = s.read_samples(&mut out, 0, chunk).unwrap();
        if got == 0 {
            break;
        }
        let mut part = Voltages::zeros(nchan, npol, got);
        for c in 0..nchan {
            for p in 0..npol {
                part.series_mut(c, p)
                    .copy_from_slice(&out.series(c, p)[..got]);
            }
        }
        parts.push(part);
    }
    let total = parts.iter().map(Voltages::nsamp).sum();
    let mut all = Voltages::zeros(nchan, npol, total);
    let mut at = 0;
    for part in &parts {
        for c in 0..nchan {
            for p in 0..npol {
                all.series_mut(c, p)[at..at + part.nsamp()].copy_from_slice(part.series(c, p));
            }
        }
        at += part.nsamp();
    }
    assert_eq!(s.samples_read(), total as u64);
    (all, s.repairs())
}

fn random_voltages(nchan: usize, npol: usize, n: usize, complex: bool, seed: u64) -> Voltages {
    let mut rng = StdRng::seed_from_u64(seed);
    let data = (0..nchan * npol * n)
        .map(|_| {
            let re = rng.gen_range(-128i32..128) as f32;
            let im = if complex {
                rng.gen_range(-128i32..128) as f32
            } else {
                0.0
            };
            Complex32::new(re, im)
        })
        .collect();
    Voltages::from_vec(nchan, npol, n, data)
}

fn dada_header(nbit: u32, complex: bool, npol: usize, nchan: usize, bw: f64) -> DadaHeader {
    let mut h = DadaHeader::with_defaults();
    let rate = bw.abs() / nchan as f64 * if complex { 1.0 } else { 2.0 };
    h.set("NBIT", nbit);
    h.set("NDIM", if complex { 2 } else { 1 });
    h.set("NPOL", npol);
    h.set("NCHAN", nchan);
    h.set("FREQ", 1400.0);
    h.set("BW", bw);
    h.set("TSAMP", 1.0 / rate);
    h
}

#[test]
fn dada_roundtrip_all_encodings() {
    for (nbit, complex, npol, nchan, bw) in [
        (8, true, 2, 1, 16.0),
        (8, true, 1, 4, -8.0),
        (32, false, 2, 3, 3.0),
        (32, true, 2, 2, 4.0),
        (8, false, 1, 1, 2.0),
    ] {
        let v = random_voltages(nchan, npol, 1000, complex, nbit as u64 + nchan as u64);
        let path = tmp(&format!("rt_{nbit}_{complex}_{npol}_{nchan}.dada"));
        let mut f = std::fs::File::create(&path).unwrap();
        write_dada(&mut f, &dada_header(nbit, complex, npol, nchan, bw), &v).unwrap();
        drop(f);
        let mut r = BasebandReader::open(&path).unwrap();
        assert_eq!(r.nsamples(), 1000);
        let b = r.band();
        assert_eq!((b.complex, b.npol, b.nchan()), (complex, npol, nchan));
        assert_eq!(b.sideband, Sideband::from_bandwidth(bw));
        assert_eq!(r.read(0, 1000).unwrap(), v, "nbit {nbit} complex {complex}");
    }
}

#[test]
fn dada_order_key_and_multiple_frames() {
    // Two frames, each with its own header, written in TFP order by hand.
    let (nchan, npol, n) = (3usize, 2usize, 50usize);
    let v = random_voltages(nchan, npol, 2 * n, true, 9);
    let mut h = dada_header(8, true, npol, nchan, 3.0);
    h.set("ORDER", "TFP");
    h.set("FILE_SIZE", n * nchan * npol * 2);
    let path = tmp("tfp.dada");
    let mut f = std::fs::File::create(&path).unwrap();
    for frame in 0..2 {
        f.write_all(&h.to_bytes().unwrap()).unwrap();
        let mut payload = Vec::new();
        for t in frame * n..(frame + 1) * n {
            for c in 0..nchan {
                for p in 0..npol {
                    let z = v.get(c, p, t);
                    payload.push(z.re as i8 as u8);
                    payload.push(z.im as i8 as u8);
                }
            }
        }
        f.write_all(&payload).unwrap();
    }
    drop(f);
    let mut r = BasebandReader::open(&path).unwrap();
    assert_eq!(r.nframes(), 2);
    assert_eq!(r.nsamples(), 2 * n as u64);
    assert_eq!(r.read(0, 2 * n).unwrap(), v);
    // A read straddling the frame boundary.
    let part = r.read(n as u64 - 5, 10).unwrap();
    assert_eq!(part.series(2, 1), &v.series(2, 1)[n - 5..n + 5]);
}

#[test]
fn guppi_roundtrip_blocks_and_overlap() {
    let v = random_voltages(4, 2, 1000, true, 4);
    let mut t = GuppiHeader::default();
    t.set_num("OBSFREQ", 350.0);
    t.set_num("OBSBW", -12.5);
    t.set_num("TBIN", 4.0 / 12.5e6);
    let path = tmp("rt.raw");
    let mut f = std::fs::File::create(&path).unwrap();
    write_guppi(&mut f, &t, &v, 300).unwrap();
    drop(f);
    let mut r = BasebandReader::open(&path).unwrap();
    assert_eq!(r.nframes(), 4);
    assert_eq!(r.nsamples(), 1000);
    assert_eq!(r.band().sideband, Sideband::Lower);
    assert_eq!(r.band().centre_mhz[0], 350.0 + 6.25 - 1.5625);
    assert_eq!(r.read(0, 1000).unwrap(), v);
    // The same bytes as a stream, in chunks that straddle blocks.
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(stream_all(&bytes, 37), (v.clone(), Vec::new()));
    // 16-bit samples, beyond 8 bits' range.
    let mut loud = Voltages::zeros(4, 2, 500);
    for c in 0..4 {
        for p in 0..2 {
            for (t, z) in loud.series_mut(c, p).iter_mut().enumerate() {
                *z = Complex32::new(
                    (t as f32 - 250.0) * 97.0,
                    (c * 1000 + p * 100) as f32 - 3000.0,
                );
            }
        }
    }
    let mut bytes = Vec::new();
    write_guppi_as(&mut bytes, &t, &loud, 128, SampleFormat::Int16).unwrap();
    assert!(write_guppi_as(&mut Vec::new(), &t, &loud, 128, SampleFormat::Float32).is_err());
    let path16 = tmp("rt16.raw");
    std::fs::write(&path16, &bytes).unwrap();
    let mut r16 = BasebandReader::open(&path16).unwrap();
    assert_eq!(r16.bits_per_component(), 16);
    assert_eq!(r16.read(0, 500).unwrap(), loud);
    assert_eq!(BasebandReader::open(&path).unwrap().bits_per_component(), 8);
    assert_eq!(stream_all(&bytes, 200).0, loud);

    // Blocks of 100 samples of which the last 20 repeat at the start of the next, with
    // DIRECTIO headers: the stream must contain every sample once.
    let v = random_voltages(2, 1, 260, true, 5);
    let mut h = GuppiHeader::default();
    h.set_num("OBSFREQ", 800.0);
    h.set_num("OBSBW", 2.0);
    h.set_num("TBIN", 1e-6);
    h.set_num("OBSNCHAN", 2.0);
    h.set_num("NPOL", 2.0);
    h.set_num("NBITS", 8.0);
    h.set_num("OVERLAP", 20.0);
    h.set_num("BLOCSIZE", 400.0);
    h.set_num("DIRECTIO", 1.0);
    h.set_str("PKTFMT", "1SFA");
    let path = tmp("overlap.raw");
    let mut f = std::fs::File::create(&path).unwrap();
    for start in [0usize, 80, 160] {
        let bytes = h.to_bytes();
        assert_eq!(bytes.len() % 512, 0);
        f.write_all(&bytes).unwrap();
        for c in 0..2 {
            for t in start..start + 100 {
                let z = v.get(c, 0, t);
                f.write_all(&[z.re as i8 as u8, z.im as i8 as u8]).unwrap();
            }
        }
    }
    drop(f);
    let mut r = BasebandReader::open(&path).unwrap();
    assert_eq!(r.nsamples(), 260);
    assert_eq!(r.read(0, 260).unwrap(), v);
    // Streamed, the held-back overlap of each block is dropped when the next block comes
    // and delivered after the last.
    let bytes = std::fs::read(&path).unwrap();
    for chunk in [1, 7, 80, 100, 1000] {
        assert_eq!(
            stream_all(&bytes, chunk),
            (v.clone(), Vec::new()),
            "chunk {chunk}"
        );
    }
    // Cut inside the last block: it is dropped and reported, as the file reader does,
    // and the block before it keeps its overlap.
    let (got, repairs) = stream_all(&bytes[..bytes.len() - 10], 64);
    assert_eq!(got.nsamp(), 180);
    assert_eq!(got.series(1, 0), &v.series(1, 0)[..180]);
    assert!(
        repairs.len() == 1 && repairs[0].contains("dropped"),
        "{repairs:?}"
    );
}

#[test]
fn broken_files_give_clear_errors() {
    let path = tmp("bad_nbit.dada");
    let mut h = dada_header(8, true, 1, 1, 1.0);
    h.set("NBIT", 2);
    let mut bytes = h.to_bytes().unwrap();
    bytes.extend_from_slice(&[0; 64]);
    std::fs::write(&path, &bytes).unwrap();
    let e = BasebandReader::open(&path).unwrap_err();
    match &e {
        ReadError::Header {
            source: HeaderError::Invalid { key, expected, .. },
            ..
        } => {
            assert_eq!(key, "NBIT");
            assert!(expected.contains('8'));
        }
        other => panic!("{other:?}"),
    }
    let chain = format!("{}: {}", e, std::error::Error::source(&e).unwrap());
    assert!(
        chain.contains("bad_nbit.dada") && chain.contains("NBIT"),
        "{chain}"
    );

    let path = tmp("unknown.bin");
    std::fs::write(&path, b"\x93NUMPY whatever").unwrap();
    assert!(matches!(
        BasebandReader::open(&path),
        Err(ReadError::UnknownFormat { .. })
    ));

    let path = tmp("header_only.dada");
    std::fs::write(&path, dada_header(8, true, 1, 1, 1.0).to_bytes().unwrap()).unwrap();
    assert!(matches!(
        BasebandReader::open(&path),
        Err(ReadError::Truncated { .. })
    ));

    // A GUPPI block whose payload is cut: dropped, and with no other block, an error.
    let v = random_voltages(2, 1, 100, true, 1);
    let mut t = GuppiHeader::default();
    t.set_num("OBSFREQ", 800.0);
    t.set_num("OBSBW", 2.0);
    t.set_num("TBIN", 1e-6);
    let mut buf = Vec::new();
    write_guppi(&mut buf, &t, &v, 50).unwrap();
    let path = tmp("cut.raw");
    std::fs::write(&path, &buf[..buf.len() - 10]).unwrap();
    let r = BasebandReader::open(&path).unwrap();
    assert_eq!(r.nsamples(), 50);
    assert_eq!(r.warnings().len(), 1);
    let first_block_end = buf.len() / 2;
    std::fs::write(&path, &buf[..first_block_end - 1]).unwrap();
    assert!(matches!(
        BasebandReader::open(&path),
        Err(ReadError::Truncated { .. })
    ));

    // Missing key, inconsistent bandwidth.
    let path = tmp("bad_obsbw.raw");
    let mut h = GuppiHeader::parse(&t.to_bytes()).unwrap();
    h.set_num("BLOCSIZE", 400.0);
    h.set_num("OBSNCHAN", 2.0);
    h.set_num("NPOL", 2.0);
    h.set_num("NBITS", 8.0);
    let mut bad = h.clone();
    bad.set_num("OBSBW", 5.0);
    let mut bytes = bad.to_bytes();
    bytes.extend_from_slice(&[0; 400]);
    std::fs::write(&path, &bytes).unwrap();
    let e = BasebandReader::open(&path).unwrap_err();
    let msg = std::error::Error::source(&e).unwrap().to_string();
    assert!(msg.contains("OBSBW") && msg.contains("TBIN"), "{msg}");
}

#[test]
fn sigproc_roundtrip() {
    let data: Vec<f32> = (0..777).map(|i| (i as f32 * 0.37).sin()).collect();
    let mut h = SigprocHeader::time_series("J0534+2200", 58000.123456789, 6.4e-5, 1400.0, 56.7);
    h.telescope_id = 5;
    h.position = Some(SkyPosition::parse("05:34:31.973", "22:00:52.06").unwrap());
    let mut buf = Vec::new();
    write_tim(&mut buf, &h, &data).unwrap();
    let (h2, d2) = read_sigproc(&mut buf.as_slice()).unwrap();
    let (p, p2) = (h.position.unwrap(), h2.position.unwrap());
    assert_eq!((p2.ra_text(), p2.dec_text()), (p.ra_text(), p.dec_text()));
    assert_eq!(
        SigprocHeader {
            position: h.position,
            ..h2
        },
        h
    );
    assert_eq!(d2, data);

    let mut fh = h.clone();
    fh.nchans = 7;
    fh.fch1_mhz = 1500.0;
    fh.foff_mhz = -2.0;
    let mut buf = Vec::new();
    write_fil(&mut buf, &fh, &data[..770]).unwrap();
    let (h3, d3) = read_sigproc(&mut buf.as_slice()).unwrap();
    assert_eq!((h3.data_type, h3.nchans, h3.foff_mhz), (1, 7, -2.0));
    assert_eq!(d3, &data[..770]);
    assert!(write_fil(&mut Vec::new(), &fh, &data[..776]).is_err());
}

#[test]
fn presto_roundtrip() {
    let data: Vec<f32> = (0..1234).map(|i| i as f32 - 600.5).collect();
    let inf = InfFile {
        name: String::new(),
        telescope: "Lovell".into(),
        instrument: "psrsearch".into(),
        object: "B1937+21".into(),
        ra: "19:39:38.5612".into(),
        dec: "21:34:59.1259".into(),
        observer: "SC99".into(),
        epoch_mjd: 51_500.123_456_789,
        barycentred: false,
        n: 0,
        dt: 1.6e-5,
        beam_diameter_arcsec: 720.0,
        dm: 71.02,
        low_channel_mhz: 1400.25,
        total_bw_mhz: 8.0,
        nchan: 4,
        chan_bw_mhz: 2.0,
        analyzer: "psrsearch".into(),
        notes: "round trip".into(),
    };
    let base = tmp("series");
    let (dat, infp) = write_dat_inf(&base, &inf, &data).unwrap();
    assert!(dat.ends_with("series.dat") && infp.ends_with("series.inf"));
    let (back, d) = read_dat_inf(&base).unwrap();
    assert_eq!(d, data);
    assert_eq!(back.name, "series");
    assert_eq!(back.n, 1234);
    assert!((back.epoch_mjd - inf.epoch_mjd).abs() < 1e-11);
    assert_eq!(
        InfFile {
            name: String::new(),
            n: 0,
            epoch_mjd: inf.epoch_mjd,
            ..back
        },
        inf
    );
    std::fs::write(&dat, [0u8; 8]).unwrap();
    assert!(read_dat_inf(&base).is_err());
}

#[test]
fn npy_roundtrip() {
    let f: Vec<f32> = (0..60).map(|i| i as f32 / 3.0).collect();
    let mut buf = Vec::new();
    npy::write_f32(&mut buf, &[60], &f).unwrap();
    let a = npy::read(&mut buf.as_slice()).unwrap();
    assert_eq!(a.shape, vec![60]);
    assert_eq!(a.data, npy::NpyData::F32(f));

    let c: Vec<Complex32> = (0..24)
        .map(|i| Complex32::new(i as f32, -(i as f32)))
        .collect();
    let mut buf = Vec::new();
    npy::write_c64(&mut buf, &[2, 3, 4], &c).unwrap();
    assert_eq!(&buf[..8], b"\x93NUMPY\x01\x00");
    let a = npy::read(&mut buf.as_slice()).unwrap();
    assert_eq!(a.shape, vec![2, 3, 4]);
    assert_eq!(a.data, npy::NpyData::C64(c));
}

#[test]
fn candidate_tables_roundtrip() {
    let cands = vec![
        Candidate {
            rank: 1,
            period_s: 0.033_130_297_1,
            freq_hz: 30.183_9,
            dm: 26.0,
            sigma: 29.61,
            snr: 37.1,
            nharm: 16,
            dm_hits: 33,
            duty: 0.031_25,
            flag: String::new(),
            fdot_hz_s: 0.0,
            accel_ms2: 0.0,
        },
        Candidate {
            rank: 2,
            period_s: 1.0 / 3.0,
            freq_hz: 3.0,
            dm: 0.1 + 0.2,
            sigma: 6.000_000_1,
            snr: 7.0,
            nharm: 1,
            dm_hits: 1,
            duty: 0.5,
            flag: "zero-DM(97%)".into(),
            fdot_hz_s: -1.25e-3,
            accel_ms2: -124.9,
        },
    ];
    let mut buf = Vec::new();
    candidates::write_csv(&mut buf, &Metadata::default(), &cands).unwrap();
    assert!(String::from_utf8_lossy(&buf).starts_with(
        "rank,period_s,freq_hz,dm,sigma,snr,nharm,dm_hits,duty,flag,fdot_hz_s,accel_ms2\n"
    ));
    assert_eq!(candidates::read_csv(&mut buf.as_slice()).unwrap(), cands);
    // With metadata: `# key = value` lines first.
    let meta = Metadata {
        source: "B1937+21".into(),
        telescope: "Lovell".into(),
        start_mjd: Some(51_500.123_456_789),
        position: Some(SkyPosition::parse("19:39:38.5612", "21:34:59.1259").unwrap()),
    };
    let mut buf = Vec::new();
    candidates::write_csv(&mut buf, &meta, &cands).unwrap();
    let text = String::from_utf8_lossy(&buf).into_owned();
    assert!(
        text.starts_with("# source = B1937+21\n# telescope = Lovell\n# ra = 19:39:38.5612\n"),
        "{text}"
    );
    assert_eq!(
        candidates::read_csv_table(&mut buf.as_slice()).unwrap(),
        (meta.clone(), cands.clone())
    );
    // Tables from before the flag column still read, unflagged.
    let old = "rank,period_s,freq_hz,dm,sigma,snr,nharm,dm_hits,duty\n1,0.5,2,3,9,8,4,5,0.1\n";
    let read = candidates::read_csv(&mut old.as_bytes()).unwrap();
    assert_eq!((read[0].dm, read[0].flag.as_str()), (3.0, ""));
    // And those from before the drift columns, without drift.
    let flagged =
        "rank,period_s,freq_hz,dm,sigma,snr,nharm,dm_hits,duty,flag\n1,0.5,2,3,9,8,4,5,0.1,x\n";
    let read = candidates::read_csv(&mut flagged.as_bytes()).unwrap();
    assert_eq!((read[0].flag.as_str(), read[0].fdot_hz_s), ("x", 0.0));
    let mut buf = Vec::new();
    candidates::write_json(&mut buf, &meta, &cands).unwrap();
    assert_eq!(
        candidates::read_json_table(&mut buf.as_slice()).unwrap(),
        (meta, cands.clone())
    );
    // A bare array, as written before the metadata was, still reads.
    let bare = serde_json::to_vec(&cands).unwrap();
    assert_eq!(candidates::read_json(&mut bare.as_slice()).unwrap(), cands);
}

/// The observation's metadata goes into every baseband format the simulator writes, comes
/// out of every reader, and through every product: SIGPROC `.tim` and `.fil` (telescope
/// id, packed position, start), PRESTO `.inf`, candidate CSV and JSON, and ACCEL files.
#[test]
fn metadata_round_trips_through_every_reader_and_writer() {
    use psrsearch::format::accel;
    use psrsearch::format::sigproc::telescope_id;
    use psrsearch::search::{search_file, SearchConfig};
    use psrsearch::simulate::{write_simulation, Pulsar, SimConfig, SimFormat};

    let meta = Metadata {
        source: "J0437-4715".into(),
        telescope: "Parkes".into(),
        start_mjd: Some(58_000.25),
        position: Some(SkyPosition::parse("04:37:15.8961", "-47:15:09.1100").unwrap()),
    };
    let obs = SimConfig {
        centre_mhz: 430.0,
        bandwidth_mhz: 2.0,
        nchan: 2,
        npol: 1,
        nsamples: 1 << 17,
        pulsars: vec![Pulsar {
            period_s: 0.01,
            dm: 10.0,
            duty_cycle: 0.05,
            amplitude: 0.5,
            orbit: None,
        }],
        metadata: meta.clone(),
        ..SimConfig::default()
    };
    let texts = |m: &Metadata| {
        let p = m.position.unwrap();
        (
            m.source.clone(),
            m.telescope.clone(),
            p.ra_text(),
            p.dec_text(),
        )
    };
    let want = texts(&meta);
    for (name, format) in [
        ("meta.dada", SimFormat::Dada8),
        (
            "meta.raw",
            SimFormat::Guppi {
                block_samples: 1 << 15,
            },
        ),
        ("meta.vdif", SimFormat::Vdif8),
    ] {
        let path = tmp(name);
        write_simulation(&obs, format, &path).unwrap();
        let r = BasebandReader::open(&path).unwrap();
        assert_eq!(texts(r.metadata()), want, "{name}");
        let mjd = r.metadata().start_mjd.unwrap();
        assert!((mjd - 58_000.25).abs() < 1e-9, "{name}: {mjd}");
    }

    let mut r = BasebandReader::open(tmp("meta.dada")).unwrap();
    let cfg = psrsearch::PlanConfig::default().downsample(16);
    let out =
        psrsearch::products::dedisperse_file(&mut r, 10.0, &cfg, false, &mut |_, _| {}).unwrap();
    for ext in ["tim", "fil"] {
        let path = tmp("meta_products").with_extension(ext);
        if ext == "tim" {
            out.write_tim(&path).unwrap();
        } else {
            out.write_fil(&path).unwrap();
        }
        let (h, _) = read_sigproc(&mut std::fs::File::open(&path).unwrap()).unwrap();
        assert_eq!(
            (h.telescope_id, h.source_name.as_str()),
            (4, "J0437-4715"),
            "{ext}"
        );
        let p = h.position.unwrap();
        assert_eq!(
            (p.ra_text(), p.dec_text()),
            (want.2.clone(), want.3.clone()),
            "{ext}"
        );
        // The series starts `lead` input samples after the file does.
        assert!((h.tstart_mjd - out.start_mjd()).abs() < 1e-12, "{ext}");
        assert!(h.tstart_mjd > 58_000.25 && h.tstart_mjd < 58_000.25 + 1.0 / 86_400.0);
        // SIGPROC packs the position as hhmmss.s: RA 43715.8961, Dec -471509.11.
        let (raj, dej) = p.sigproc();
        assert!((raj - 43_715.896_1).abs() < 1e-6 && (dej + 471_509.11).abs() < 1e-6);
    }
    let base = tmp("meta_products");
    out.write_presto(&base).unwrap();
    let (inf, _) = read_dat_inf(&base).unwrap();
    let m = inf.metadata().unwrap();
    assert_eq!(texts(&m), want);
    assert!((m.start_mjd.unwrap() - out.start_mjd()).abs() < 1e-12);
    let inf_text = std::fs::read_to_string(base.with_extension("inf")).unwrap();
    assert!(inf_text.contains("=  -47:15:09.1100\n"), "{inf_text}");

    let config = SearchConfig {
        dms: vec![8.0, 10.0, 12.0],
        plan: psrsearch::PlanConfig::default().downsample(16),
        ..SearchConfig::default()
    };
    let outcome = search_file(&mut r, &config, &mut |_, _| {}).unwrap();
    assert!(!outcome.candidates.is_empty());
    let dir = tmp("meta_search");
    let _ = std::fs::remove_dir_all(&dir);
    psrsearch::products::write_search(&outcome, &dir, false).unwrap();
    let (m, cands) = candidates::read_csv_table(&mut std::io::BufReader::new(
        std::fs::File::open(dir.join("candidates.csv")).unwrap(),
    ))
    .unwrap();
    assert_eq!(m, meta);
    let (m, json_cands) =
        candidates::read_json_table(&mut std::fs::File::open(dir.join("candidates.json")).unwrap())
            .unwrap();
    assert_eq!((m, &json_cands), (meta.clone(), &cands));
    let top = &outcome.candidates[0];
    let name = accel::file_name("candidates", top.candidate.dm, 0.0);
    let text = std::fs::read_to_string(dir.join(&name)).unwrap();
    let (accel_cands, inf) = accel::read_accel(&text).unwrap();
    let inf = inf.expect("the .inf after the tables");
    let m = inf.metadata().unwrap();
    assert_eq!(texts(&m), want);
    assert_eq!(telescope_id(&inf.telescope), 4);
    assert!((m.start_mjd.unwrap() - outcome.series_start_mjd().unwrap()).abs() < 1e-12);
    let a = accel_cands
        .iter()
        .find(|a| a.number == top.candidate.rank)
        .unwrap();
    let tobs = inf.n as f64 * inf.dt;
    assert!(
        ((a.r / tobs) / top.candidate.freq_hz - 1.0).abs() < 1e-7,
        "{a:?}"
    );
    assert_eq!(a.nharm, top.candidate.nharm);
    assert_eq!(a.harmonic_powers.len(), top.candidate.nharm);
    assert!(a.harmonic_powers[0] > 5.0, "{a:?}");
    let summed: f64 = a.harmonic_powers.iter().sum();
    assert!((a.summed_power - summed).abs() < 0.01 * a.harmonic_powers.len() as f64);
    // The fundamental's properties are measured on the series, and round-trip: a pulsar
    // steady through the observation has its power in the middle and evenly spread.
    assert_eq!(a.harmonic_props.len(), top.candidate.nharm);
    let (got, want) = (a.harmonic_props[0], top.harmonic_props[0]);
    assert!(
        (got.centroid - want.centroid).abs() < 1e-4,
        "{got:?} {want:?}"
    );
    assert!((got.centroid - 0.5).abs() < 0.1, "{got:?}");
    assert!((got.purity - 1.0).abs() < 0.2, "{got:?}");
    assert!(got.raw_power > 0.0 && (got.raw_power / want.raw_power - 1.0).abs() < 1e-3);
}
