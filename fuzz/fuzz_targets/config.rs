//! The description languages on arbitrary text: the MetaMPICH parser, the PACX-MPI
//! hostfile parser and format detection, then validation and the resolved layout of
//! whatever parses. Errors must point inside the text; nothing may panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use metampi_config::{parse_auto, parse_pacx_str, parse_str, ConfigError, MetaConfig};

fuzz_target!(|data: &[u8]| {
    // Files are read as UTF-8; `load` refuses anything else, so lossy decoding loses no
    // reachable input.
    let text = String::from_utf8_lossy(data);
    check(&text, parse_str("f.cfg", &text));
    check(&text, parse_pacx_str("f.hosts", &text));
    let _ = parse_auto("f", &text);
});

fn check(text: &str, r: Result<MetaConfig, ConfigError>) {
    match r {
        Ok(cfg) => {
            let layout = cfg.layout_ref();
            let _ = layout.to_string();
            for rank in [
                0,
                layout.world_size / 2,
                layout.world_size.saturating_sub(1),
            ] {
                let _ = layout.host_of_rank(rank);
                let _ = layout.locate(rank);
            }
            let _ = layout.host_of_rank(layout.world_size);
        }
        Err(e) => {
            // Line 0 is reserved for I/O errors; a parse error names a line of the text.
            let lines = text.split('\n').count();
            assert!(e.line >= 1 && e.line as usize <= lines + 1, "{e}");
            assert!(e.col >= 1, "{e}");
            let _ = e.snippet(text);
            let _ = e.to_string();
        }
    }
}
