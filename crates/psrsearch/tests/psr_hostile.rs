//! Baseband inputs the `baseband` fuzz target (`fuzz/fuzz_targets/baseband.rs`) found to
//! crash the readers, byte for byte: each must now end in a `ReadError`.

use std::path::PathBuf;

use psrsearch::format::stream::{BasebandStream, StreamFormat};
use psrsearch::format::vdif::VdifSidecar;
use psrsearch::{BasebandReader, ReadError};

fn tmp(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("psr_hostile");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// Opens `bytes` as a file beside side-car text `car`.
fn open_file(name: &str, bytes: &[u8], car: &str) -> Result<BasebandReader, ReadError> {
    let path = tmp(name);
    std::fs::write(&path, bytes).unwrap();
    std::fs::write(VdifSidecar::path_of(&path), car).unwrap();
    BasebandReader::open(&path)
}

/// A VDIF header whose frame the file cuts short, with a side-car that gives no sample
/// rate: the indexer kept no frame and then counted frames per second from the first
/// one it kept (an index out of bounds).
#[test]
fn a_vdif_file_shorter_than_its_first_frame_is_an_error() {
    let bytes = [
        0x48, 0x45, 0x41, 0x44, 0x45, 0x00, 0x00, 0x44, 0x41, 0x0a, 0x48, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x8b, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x9f, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x56, 0x00,
    ];
    match open_file("short_first_frame.vdif", &bytes, "") {
        Err(ReadError::Truncated { detail, .. }) => {
            assert!(detail.contains("first frame"), "{detail}")
        }
        Err(e) => panic!("expected the file to be reported cut short, got {e}"),
        Ok(_) => panic!("a file without one whole frame opened"),
    }
    // The same bytes as a stream, with and without a side-car: an error or a clean end.
    for car in [None, Some(""), Some("FREQ 820\nSAMPLE_RATE 1")] {
        if let Ok(mut s) = BasebandStream::open(&bytes[..], "<test>", StreamFormat::Vdif, car) {
            let band = s.band().clone();
            let mut out = psrsearch::Voltages::zeros(band.nchan(), band.npol, 16);
            let _ = s.read_samples(&mut out, 0, 16);
        }
    }
}

/// An error and its sources, as the command line prints them.
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut s = e.source();
    while let Some(c) = s {
        out += &format!(": {c}");
        s = c.source();
    }
    out
}

/// A DADA header (simulator layout) with `nchan` channels that fill the band exactly.
fn dada_claiming(nchan: u64) -> Vec<u8> {
    let text = format!(
        "HEADER DADA\nHDR_VERSION 1.0\nHDR_SIZE 4096\nFREQ {f}\nBW {f}\nTSAMP 1\nNBIT 8\n\
         NDIM 2\nNPOL 2\nNCHAN {nchan}\nORDER TPF\n",
        f = nchan
    );
    let mut b = text.into_bytes();
    b.resize(4096, 0);
    b.extend_from_slice(&[0u8; 64]);
    b
}

/// Headers may claim any channel count. One of 10¹² channels made the stream's master
/// build a band table of 8 TB and abort; one of 10⁸ made the plan's tables 40 GB. Now the
/// header is refused with its key named, and a plan beyond the machine's memory is an
/// error before it allocates.
#[test]
fn absurd_channel_counts_are_errors() {
    let huge = dada_claiming(1_000_000_000_000);
    let Err(e) = BasebandStream::open(&huge[..], "<test>", StreamFormat::Auto, None) else {
        panic!("a header of 10^12 channels opened");
    };
    let msg = chain(&e);
    assert!(msg.contains("NCHAN") && msg.contains("at most"), "{msg}");
    let Err(e) = open_file("huge_nchan.dada", &huge, "") else {
        panic!("opened");
    };
    assert!(chain(&e).contains("NCHAN"), "{e}");

    // Within the header limit, but no machine holds the plan's tables for 64 DMs.
    let many = dada_claiming(psrsearch::format::MAX_NCHAN as u64);
    let s = BasebandStream::open(&many[..], "<test>", StreamFormat::Auto, None).unwrap();
    let dms: Vec<f64> = (0..64).map(f64::from).collect();
    let plan = psrsearch::DedispersionPlan::new(s.band(), &dms, &Default::default());
    let Err(err) = plan else {
        panic!("a plan of 64 DMs × 2^20 channels was made");
    };
    assert!(err.to_string().contains("memory"), "{err}");
}

/// A DADA header whose `HDR_SIZE` claims 5.5 TB: the file reader allocated that much to
/// read the header again in full (found by the fuzzer); the stream reader would have too.
#[test]
fn a_dada_header_size_beyond_reason_is_an_error() {
    for size in ["5555555555555", "1048577"] {
        let mut b =
            format!("HEADER DADA\nHDR_VERSION 1.0\nHDR_SIZE {size}\nFREQ 820\nBW 2\n").into_bytes();
        b.resize(4096 + 64, 0);
        let Err(e) = open_file("huge_hdr_size.dada", &b, "") else {
            panic!("opened");
        };
        assert!(chain(&e).contains("HDR_SIZE"), "{}", chain(&e));
        let Err(e) = BasebandStream::open(&b[..], "<test>", StreamFormat::Dada, None) else {
            panic!("opened");
        };
        assert!(chain(&e).contains("at most 1048576"), "{}", chain(&e));
    }
}
