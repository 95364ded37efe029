//! The font of the PNG figures (`bench --plot`, the trace timeline): a subset of DejaVu Sans
//! compiled into the binary (the same as psrsearch's plots; licence in `assets/`), so drawing
//! needs no system fonts.

use std::sync::Once;

static FONT: &[u8] = include_bytes!("../assets/DejaVuSans-subset.ttf");

/// Makes plotters draw `"sans-serif"` with [`FONT`]; call before drawing text.
pub fn register() {
    static REGISTER: Once = Once::new();
    REGISTER.call_once(|| {
        // The font is compiled in and known to parse; a failure would only lose the labels.
        let _ =
            plotters::style::register_font("sans-serif", plotters::style::FontStyle::Normal, FONT);
    });
}
