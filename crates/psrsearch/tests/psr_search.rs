//! End to end on simulated files: every injected pulsar is recovered (period within 0.1%,
//! DM within one trial step, significance above threshold) and pure noise yields nothing
//! above threshold, in DADA and GUPPI, upper and lower sideband, complex and real data.

use std::path::PathBuf;

use psrsearch::demo::recovers;
use psrsearch::search::{dm_grid, search_file, SearchConfig};
use psrsearch::simulate::{write_simulation, Pulsar, SimConfig, SimFormat};
use psrsearch::{BasebandReader, PlanConfig};

fn tmp(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("psr_search");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// 2 MHz at 430 MHz in two channels, one polarisation, 0.52 s: small enough for a test,
/// low enough in frequency that one DM unit smears a pulse by 0.26 ms.
fn observation(seed: u64, pulsars: Vec<Pulsar>) -> SimConfig {
    SimConfig {
        centre_mhz: 430.0,
        bandwidth_mhz: 2.0,
        nchan: 2,
        npol: 1,
        complex: true,
        nsamples: 1 << 19,
        seed,
        pulsars,
        ..SimConfig::default()
    }
}

fn two_pulsars() -> Vec<Pulsar> {
    vec![
        Pulsar {
            period_s: 0.020_31,
            dm: 15.3,
            duty_cycle: 0.03,
            amplitude: 0.25,
            orbit: None,
        },
        Pulsar {
            period_s: 0.006_113,
            dm: 33.6,
            duty_cycle: 0.06,
            amplitude: 0.15,
            orbit: None,
        },
    ]
}

/// Width, height and grey level (0-255) of each pixel of a PNG.
fn decode_png(path: &std::path::Path) -> (u32, u32, Vec<u8>) {
    let decoder = png::Decoder::new(std::fs::File::open(path).unwrap());
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    let channels = info.color_type.samples();
    assert_eq!(info.bit_depth, png::BitDepth::Eight);
    let grey = buf[..info.buffer_size()]
        .chunks(channels)
        .map(|p| ((p[0] as u32 + p[1 % channels] as u32 + p[2 % channels] as u32) / 3) as u8)
        .collect();
    (info.width, info.height, grey)
}

fn search_config() -> SearchConfig {
    SearchConfig {
        dms: dm_grid(0.0, 40.0, 1.0),
        plan: PlanConfig::default().downsample(16),
        ..SearchConfig::default()
    }
}

fn run(name: &str, obs: &SimConfig, format: SimFormat) -> psrsearch::SearchOutcome {
    let path = tmp(name);
    write_simulation(obs, format, &path).unwrap();
    let mut reader = BasebandReader::open(&path).unwrap();
    search_file(&mut reader, &search_config(), &mut |_, _| {}).unwrap()
}

fn assert_recovered(outcome: &psrsearch::SearchOutcome, pulsars: &[Pulsar]) {
    let table: Vec<_> = outcome.candidates.iter().map(|c| &c.candidate).collect();
    for (i, p) in pulsars.iter().enumerate() {
        let hit = table.iter().find(|c| recovers(p, c, 1.0));
        let Some(c) = hit else {
            panic!("pulsar {p:?} not recovered; candidates {table:#?}");
        };
        assert!(
            c.rank <= pulsars.len(),
            "pulsar {i} ranked {} (table {table:#?})",
            c.rank
        );
        assert!(c.sigma >= 6.0 && c.snr >= 8.0, "{c:?}");
    }
}

#[test]
fn dada_two_pulsars_recovered() {
    let obs = observation(11, two_pulsars());
    let outcome = run("two.dada", &obs, SimFormat::Dada8);
    assert_recovered(&outcome, &obs.pulsars);
    // The S/N-against-DM curve of each peaks at its DM.
    for c in outcome.candidates.iter().take(2) {
        let best = outcome.dms[c
            .snr_vs_dm
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .unwrap()
            .0];
        assert!((best - c.candidate.dm).abs() <= 2.0);
    }
}

#[test]
fn guppi_lower_sideband_recovered() {
    let mut obs = observation(12, two_pulsars());
    obs.bandwidth_mhz = -2.0;
    let outcome = run(
        "two_lsb.raw",
        &obs,
        SimFormat::Guppi {
            block_samples: 100_000,
        },
    );
    assert_recovered(&outcome, &obs.pulsars);
}

#[test]
fn vdif_two_polarisations_lower_sideband_recovered() {
    // Four threads (2 channels x 2 polarisations) of 8-bit VDIF and its side-car.
    let mut obs = observation(14, two_pulsars());
    obs.npol = 2;
    obs.bandwidth_mhz = -2.0;
    let outcome = run("two.vdif", &obs, SimFormat::Vdif8);
    assert_recovered(&outcome, &obs.pulsars);
}

#[test]
fn real_sampled_float_dada_recovered() {
    let mut obs = observation(13, vec![two_pulsars()[0].clone()]);
    obs.complex = false;
    obs.nchan = 1;
    obs.nsamples = 1 << 21;
    let outcome = run("real.dada", &obs, SimFormat::Dada32);
    assert_recovered(&outcome, &obs.pulsars);
}

#[test]
fn pure_noise_gives_no_candidate() {
    for seed in [21, 22] {
        let obs = observation(seed, Vec::new());
        let outcome = run(&format!("noise{seed}.dada"), &obs, SimFormat::Dada8);
        assert!(
            outcome.candidates.is_empty(),
            "seed {seed}: {:#?}",
            outcome
                .candidates
                .iter()
                .map(|c| &c.candidate)
                .collect::<Vec<_>>()
        );
    }
}

#[test]
fn cli_simulate_dedisperse_search() {
    let exe = env!("CARGO_BIN_EXE_psrsearch");
    let file = tmp("cli.dada");
    let out = std::process::Command::new(exe)
        .args(["simulate", "--out"])
        .arg(&file)
        .args([
            "--freq",
            "430",
            "--bw",
            "2",
            "--nchan",
            "2",
            "--npol",
            "1",
            "--duration",
            "0.3",
        ])
        .args(["--seed", "5", "--pulsar", "20.31:15.3:0.03:0.3"])
        .args([
            "--source",
            "J2016+2830",
            "--telescope",
            "GBT",
            "--mjd",
            "60123.5",
        ])
        .args(["--ra", "20:16:00.2", "--dec", "-08:30:30"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dir = tmp("cli_out");
    let out = std::process::Command::new(exe)
        .arg("dedisperse")
        .arg(&file)
        .args(["--dm", "15.3", "--downsample", "16", "--tim"])
        .arg(dir.with_extension("tim"))
        .arg("--dat")
        .arg(dir.with_extension("dat"))
        .arg("--fil")
        .arg(dir.with_extension("fil"))
        .arg("--voltages")
        .arg(dir.with_extension("npy"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (h, data) = psrsearch::format::sigproc::read_sigproc(
        &mut std::fs::File::open(dir.with_extension("tim")).unwrap(),
    )
    .unwrap();
    assert_eq!(h.refdm, Some(15.3));
    assert!((h.tsamp_s - 16e-6).abs() < 1e-12);
    // The simulator's --telescope, --ra, --dec and --mjd reach the products: GBT is
    // SIGPROC's telescope 6.
    assert_eq!((h.telescope_id, h.source_name.as_str()), (6, "J2016+2830"));
    let p = h.position.unwrap();
    assert_eq!(
        (p.ra_text(), p.dec_text()),
        ("20:16:00.2000".into(), "-08:30:30.0000".into())
    );
    assert!((h.tstart_mjd - 60_123.5).abs() < 1e-6, "{}", h.tstart_mjd);
    let (inf, dat) = psrsearch::format::presto::read_dat_inf(&dir).unwrap();
    assert_eq!(dat, data);
    assert_eq!(inf.dm, 15.3);
    assert_eq!(
        (inf.telescope.as_str(), inf.ra.as_str(), inf.dec.as_str()),
        ("GBT", "20:16:00.2000", "-08:30:30.0000")
    );
    let npy =
        psrsearch::format::npy::read(&mut std::fs::File::open(dir.with_extension("npy")).unwrap())
            .unwrap();
    assert_eq!(npy.shape[..2], [2, 1]);
    let out = std::process::Command::new(exe)
        .arg("search")
        .arg(&file)
        .args([
            "--dm-start",
            "0",
            "--dm-end",
            "30",
            "--dm-step",
            "1",
            "--downsample",
            "16",
            "--out-dir",
        ])
        .arg(&dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cands = psrsearch::format::candidates::read_csv(&mut std::io::BufReader::new(
        std::fs::File::open(dir.join("candidates.csv")).unwrap(),
    ))
    .unwrap();
    assert!(!cands.is_empty(), "{stdout}");
    assert!(
        ((cands[0].period_s - 0.02031) / 0.02031).abs() < 1e-3,
        "{stdout}"
    );
    for png in ["snr_vs_dm.png", "periodogram.png", "profile_1.png"] {
        let bytes = std::fs::read(dir.join(png)).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{png}");
    }
    let (meta, _) = psrsearch::format::candidates::read_csv_table(&mut std::io::BufReader::new(
        std::fs::File::open(dir.join("candidates.csv")).unwrap(),
    ))
    .unwrap();
    assert_eq!(
        (meta.source.as_str(), meta.telescope.as_str()),
        ("J2016+2830", "GBT")
    );
    // The candidate plot decodes, at its size, and has ink in each of its panels.
    let (w, h, pixels) = decode_png(&dir.join("candidate_1.png"));
    assert_eq!((w, h), psrsearch::plot::CANDIDATE_PLOT_SIZE);
    let (cols, rows) = (3, 2);
    for r in 0..rows {
        for c in 0..cols {
            let (x0, y0) = (c * w / cols + 80, 165 + r * (h - 165) / rows + 40);
            let (x1, y1) = (x0 + w / cols - 120, y0 + (h - 165) / rows - 90);
            let dark = (y0..y1)
                .flat_map(|y| (x0..x1).map(move |x| (x, y)))
                .filter(|&(x, y)| pixels[(y * w + x) as usize] < 128)
                .count();
            assert!(dark > 200, "panel {r},{c}: {dark} dark pixels");
        }
    }
    // Only as many plots as asked for.
    assert!(!dir.join("candidate_4.png").exists());
    // A bad header reaches the user as an error naming the key.
    let bad = tmp("bad.dada");
    let mut text = std::fs::read(&file).unwrap();
    let pos = text.windows(4).position(|w| w == b"NBIT").unwrap();
    text[pos + 13] = b'4';
    std::fs::write(&bad, &text).unwrap();
    let out = std::process::Command::new(exe)
        .arg("info")
        .arg(&bad)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("NBIT"), "{stderr}");
}

#[test]
fn sixteen_bit_dada_and_guppi_search_like_eight_bit() {
    // At the default noise level every simulated value fits 8 bits, so 16-bit files
    // decode to the same samples and must give the very same candidates.
    let table = |o: &psrsearch::SearchOutcome| format!("{:?}", o.candidates);
    let obs = observation(15, two_pulsars());
    let dada8 = run("b8.dada", &obs, SimFormat::Dada8);
    let dada16 = run("b16.dada", &obs, SimFormat::Dada16);
    assert_recovered(&dada16, &obs.pulsars);
    assert_eq!(table(&dada8), table(&dada16));
    let blocks = 100_000;
    let guppi8 = run(
        "b8.raw",
        &obs,
        SimFormat::Guppi {
            block_samples: blocks,
        },
    );
    let guppi16 = run(
        "b16.raw",
        &obs,
        SimFormat::Guppi16 {
            block_samples: blocks,
        },
    );
    assert_eq!(table(&guppi8), table(&guppi16));
    // Noise 40 times stronger clips in 8 bits; 16 bits hold it.
    let mut loud = observation(16, two_pulsars());
    loud.rms *= 40.0;
    assert_recovered(&run("loud16.dada", &loud, SimFormat::Dada16), &loud.pulsars);
}

/// Simulates the small observation of the command-line tests into `name`.
fn cli_observation(name: &str) -> PathBuf {
    let file = tmp(name);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_psrsearch"))
        .args(["simulate", "--out"])
        .arg(&file)
        .args(["--freq", "430", "--bw", "2", "--nchan", "2", "--npol", "1"])
        .args([
            "--duration",
            "0.3",
            "--seed",
            "5",
            "--pulsar",
            "20.31:15.3:0.03:0.3",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    file
}

/// Runs `psrsearch search FILE ARGS` with stderr redirected to a file and returns that log.
fn search_log(file: &std::path::Path, args: &[&str], name: &str) -> String {
    let log = tmp(&format!("{name}.log"));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_psrsearch"))
        .arg("search")
        .arg(file)
        .args([
            "--dm-end",
            "20",
            "--dm-step",
            "2",
            "--downsample",
            "16",
            "--no-plots",
        ])
        .args(args)
        .arg("--out-dir")
        .arg(tmp(name))
        .stderr(std::fs::File::create(&log).unwrap())
        .output()
        .unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(out.status.success(), "{text}");
    text
}

/// Progress in a log (stderr not a terminal) comes as whole lines, never a `\r` redraw,
/// and ends with the last count: for the search in this process and for the distributed one,
/// whose root reports through the driver.
#[test]
fn cli_progress_in_a_log_is_plain_lines() {
    let file = cli_observation("progress.dada");
    let log = search_log(&file, &[], "progress");
    assert!(!log.contains('\r'), "{log:?}");
    assert!(
        log.lines()
            .any(|l| l.starts_with("searching: ") && l.ends_with(" blocks (100%)")),
        "{log}"
    );

    let cfg = tmp("progress-one-site.cfg");
    std::fs::write(
        &cfg,
        "METAHOST a { LAUNCH = local; NPROCS = 3; NODES = a0; }\n",
    )
    .unwrap();
    let log = search_log(&file, &["--meta", cfg.to_str().unwrap()], "progress-meta");
    assert!(!log.contains('\r'), "{log:?}");
    let done = log
        .lines()
        .find(|l| l.starts_with("dedispersing: ") && l.contains("(100%)"));
    assert!(done.is_some_and(|l| l.contains(" a=")), "{log}");
}

/// A mistake in the description given to `search --meta` is named in that file, with its
/// line and column, not in the copy the job runs.
#[test]
fn cli_meta_errors_name_the_users_file() {
    let exe = env!("CARGO_BIN_EXE_psrsearch");
    let dir = tmp("meta-errors");
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("bad.cfg");
    std::fs::write(&cfg, "METAHOST a { NPROCS = two; }\n").unwrap();
    let out = std::process::Command::new(exe)
        .args(["search", "missing.dada", "--meta"])
        .arg(&cfg)
        .arg("--out-dir")
        .arg(dir.join("out"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains(&format!("{}:1:", cfg.display())), "{err}");
    assert!(!err.contains("metacomputer.cfg"), "{err}");
}

/// Mains-like interference: a broad 50 Hz modulation that is not dispersed.
fn mains_hum() -> Pulsar {
    Pulsar {
        period_s: 0.02,
        dm: 0.0,
        duty_cycle: 0.3,
        amplitude: 0.6,
        orbit: None,
    }
}

/// A pulsar beside a brighter zero-DM periodic signal: the pulsar ranks first, and the
/// interference is listed after it, flagged.
#[test]
fn zero_dm_interference_is_flagged_and_the_pulsar_ranks_first() {
    let psr = two_pulsars()[1].clone();
    let obs = observation(31, vec![psr.clone(), mains_hum()]);
    let outcome = run("hum.dada", &obs, SimFormat::Dada8);
    let table: Vec<_> = outcome.candidates.iter().map(|c| &c.candidate).collect();
    assert!(recovers(&psr, table[0], 1.0), "{table:#?}");
    assert!(table[0].flag.is_empty(), "{table:#?}");
    let hum = table
        .iter()
        .find(|c| (c.freq_hz / 50.0 - (c.freq_hz / 50.0).round()).abs() < 0.01)
        .unwrap_or_else(|| panic!("the 50 Hz signal is not listed: {table:#?}"));
    assert!(hum.flag.starts_with("zero-DM"), "{hum:?}");
    // Without flagging, the brighter interference ranks above the pulsar.
    let mut config = search_config();
    config.rfi.zero_dm_fraction = 0.0;
    let mut reader = BasebandReader::open(tmp("hum.dada")).unwrap();
    let plain = search_file(&mut reader, &config, &mut |_, _| {}).unwrap();
    assert!(
        !recovers(&psr, &plain.candidates[0].candidate, 1.0),
        "the test's interference is too weak to matter: {:#?}",
        plain.candidates[0].candidate
    );
}

/// `--birdie mains` removes 50 Hz and its harmonics from the spectra; the pulsar stays.
#[test]
fn mains_birdies_remove_the_interference() {
    let psr = two_pulsars()[1].clone();
    let obs = observation(31, vec![psr.clone(), mains_hum()]);
    let path = tmp("hum_zap.dada");
    write_simulation(&obs, SimFormat::Dada8, &path).unwrap();
    let mut config = search_config();
    config.periodicity.birdies = psrsearch::rfi::Birdie::mains();
    let mut reader = BasebandReader::open(&path).unwrap();
    let outcome = search_file(&mut reader, &config, &mut |_, _| {}).unwrap();
    let table: Vec<_> = outcome.candidates.iter().map(|c| &c.candidate).collect();
    assert!(recovers(&psr, table[0], 1.0), "{table:#?}");
    assert!(
        table
            .iter()
            .all(|c| (c.freq_hz / 50.0 - (c.freq_hz / 50.0).round()).abs() > 0.01),
        "{table:#?}"
    );
}

/// Clipping at 6 robust sigma keeps the pulsar and reports what it looked at and removed.
#[test]
fn clipping_counts_what_it_removes() {
    let obs = observation(32, vec![two_pulsars()[1].clone()]);
    let path = tmp("clip.dada");
    write_simulation(&obs, SimFormat::Dada8, &path).unwrap();
    let mut config = search_config();
    config.rfi.clip_sigma = 6.0;
    let mut reader = BasebandReader::open(&path).unwrap();
    let outcome = search_file(&mut reader, &config, &mut |_, _| {}).unwrap();
    assert_recovered(&outcome, &obs.pulsars);
    let m = &outcome.masked;
    assert_eq!(m.sigma, 6.0);
    assert!(m.total > 0 && m.clipped < m.total / 1000, "{m:?}");
}

/// A bright, narrow pulse has strong harmonics far up the spectrum: they are all one
/// candidate, whatever their ratio to the fundamental, and the width is measured finer than
/// the 64 bins folding used to have.
#[test]
fn a_pulsar_with_strong_harmonics_gives_one_candidate() {
    let psr = Pulsar {
        period_s: 0.051_3,
        dm: 15.3,
        duty_cycle: 0.005,
        amplitude: 8.0,
        orbit: None,
    };
    let obs = observation(33, vec![psr.clone()]);
    let outcome = run("narrow.dada", &obs, SimFormat::Dada8);
    let table: Vec<_> = outcome.candidates.iter().map(|c| &c.candidate).collect();
    assert!(recovers(&psr, table[0], 1.0), "{table:#?}");
    assert_eq!(table.len(), 1, "harmonics left as candidates: {table:#?}");
    let p = &outcome.candidates[0].profile;
    assert!(p.means.len() > 64, "{} bins", p.means.len());
    let duty = table[0].duty;
    assert!(
        (duty / psr.duty_cycle - 1.0).abs() < 0.5,
        "duty {duty} against FWHM {}",
        psr.duty_cycle
    );
}

/// One bright, dispersed pulse (a pulsar whose next pulse falls after the data): the
/// single-pulse search finds it at its time and DM; without the option nothing is searched.
#[test]
fn a_single_pulse_is_found_at_its_dm_and_time() {
    let psr = Pulsar {
        period_s: 0.4,
        dm: 20.0,
        duty_cycle: 0.002,
        amplitude: 3.0,
        orbit: None,
    };
    let obs = observation(34, vec![psr]);
    let path = tmp("single.dada");
    write_simulation(&obs, SimFormat::Dada8, &path).unwrap();
    let mut config = search_config();
    let mut reader = BasebandReader::open(&path).unwrap();
    let plain = search_file(&mut reader, &config, &mut |_, _| {}).unwrap();
    assert!(plain.single_pulses.is_none());
    config.single_pulse.enabled = true;
    let outcome = search_file(&mut reader, &config, &mut |_, _| {}).unwrap();
    let events = outcome.single_pulses.expect("single pulses searched");
    let pulses = psrsearch::single_pulse::group(&events, &outcome.dms);
    let p = &pulses[0];
    // The pulse at t = 0.4 s (reference frequency, the band centre) and DM 20.
    assert!((p.time_s - 0.4).abs() < 1e-3, "{p:?} of {pulses:#?}");
    assert!((p.dm - 20.0).abs() <= 1.0, "{p:?}");
    assert!(p.sigma > 10.0, "{p:?}");
    // Above 8 sigma only the pulse stands out (the detected power is a sum of 32 squares,
    // not Gaussian: its upper tail gives some 6-sigma events over 41 DMs × 7 widths).
    assert!(
        pulses.iter().filter(|p| p.sigma >= 8.0).count() == 1,
        "{pulses:#?}"
    );
}

/// A pulsar in a tight binary: its frequency drifts by about 8 Fourier bins over the
/// observation (its 8th harmonic by 64), which smears it out of the plain search; the
/// acceleration search finds it, with the drift and acceleration of its orbit.
#[test]
fn a_binary_pulsar_is_found_with_an_acceleration_search_and_not_without() {
    // At mid-observation (0.26 s) the pulsar is at the orbit's far side: no Doppler shift,
    // the largest acceleration (1.2e8 m/s², as an observation of 0.52 s needs to drift).
    let orbit = psrsearch::simulate::Orbit {
        period_s: 10.0,
        asini_lts: 1.0,
        phase: 0.25 - 0.262_144 / 10.0,
    };
    let psr = Pulsar {
        period_s: 0.01,
        dm: 15.3,
        duty_cycle: 0.04,
        amplitude: 0.3,
        orbit: Some(orbit),
    };
    let obs = observation(21, vec![psr.clone()]);
    let path = tmp("binary.dada");
    write_simulation(&obs, SimFormat::Dada8, &path).unwrap();
    let search = |zmax: f64| {
        let mut config = search_config();
        config.periodicity.max_harmonics = 8;
        config.periodicity.zmax = zmax;
        let mut reader = BasebandReader::open(&path).unwrap();
        search_file(&mut reader, &config, &mut |_, _| {}).unwrap()
    };
    let near = |c: &&&psrsearch::search::Candidate| (c.freq_hz - 100.0).abs() < 2.0;
    let plain = search(0.0);
    let plain: Vec<_> = plain.candidates.iter().map(|c| &c.candidate).collect();
    let accel = search(64.0);
    let found: Vec<_> = accel.candidates.iter().map(|c| &c.candidate).collect();
    // The truth at mid-observation: the delay's rate and acceleration there.
    let t_mid = 0.5 * obs.nsamples as f64 / 1e6;
    let a_true = orbit.accel_ms2(t_mid);
    let c = found.iter().find(near).expect("found with --zmax");
    assert_eq!(c.rank, 1, "{found:#?}");
    assert!((c.dm - 15.3).abs() <= 1.0, "{c:?}");
    // The drift's sign: moving away faster lowers the frequency.
    assert!(
        (c.accel_ms2 + a_true).abs() < 0.25 * a_true.abs(),
        "{c:?} vs {a_true}"
    );
    assert!(
        plain
            .iter()
            .find(near)
            .is_none_or(|p| p.sigma < c.sigma - 5.0),
        "{plain:#?}"
    );
}
