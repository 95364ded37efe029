//! Checked test traffic: messages that say where they come from and which they are,
//! with a checksum of their body, so that a receiver tells a lost, duplicated,
//! reordered or corrupted message from the right one.

/// One step of splitmix64: a well-mixed number from a counter.
pub fn splitmix(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Body length of message `seq` from `src` to `dst`: a tenth empty, a tenth up to `large`
/// bytes, the rest under 2,000.
pub fn length(src: i32, dst: i32, seq: u32, large: usize) -> usize {
    let mut s = (src as u64) << 40 ^ (dst as u64) << 20 ^ seq as u64;
    let r = splitmix(&mut s);
    match r % 10 {
        0 => 0,
        1 => (r >> 8) as usize % large.max(1),
        _ => (r >> 8) as usize % 2000,
    }
}

/// Message `seq` from `src` to `dst`: source, sequence, FNV-1a checksum of the body and
/// its length (20 bytes), then the body (seeded bytes, [`length`] long).
pub fn message(src: i32, dst: i32, seq: u32, large: usize) -> Vec<u8> {
    let n = length(src, dst, seq, large);
    let mut s = (seq as u64) << 32 ^ (src as u64) << 8 ^ dst as u64;
    let body: Vec<u8> = (0..n).map(|_| splitmix(&mut s) as u8).collect();
    let sum = body.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    });
    let mut m = Vec::with_capacity(n + 20);
    m.extend_from_slice(&(src as u32).to_le_bytes());
    m.extend_from_slice(&seq.to_le_bytes());
    m.extend_from_slice(&sum.to_le_bytes());
    m.extend_from_slice(&(n as u32).to_le_bytes());
    m.extend_from_slice(&body);
    m
}

/// Checks that `got`, received from `src`, is the message `seq` it was to send next.
///
/// # Panics
/// When it is not, naming what it is instead where the header says so.
pub fn check(got: &[u8], src: i32, dst: i32, seq: u32, large: usize) {
    let want = message(src, dst, seq, large);
    if got == want.as_slice() {
        return;
    }
    let head = |b: &[u8], at: usize| {
        b.get(at..at + 4)
            .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
    };
    panic!(
        "from {src} to {dst}: expected message {seq} ({} bytes), got {} bytes saying source \
         {:?}, sequence {:?}: lost, duplicated, reordered or corrupted",
        want.len(),
        got.len(),
        head(got, 0),
        head(got, 4)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_checks_only_as_itself() {
        let m = message(1, 2, 7, 1 << 16);
        check(&m, 1, 2, 7, 1 << 16);
        let other = std::panic::catch_unwind(|| check(&m, 1, 2, 8, 1 << 16));
        assert!(other.is_err(), "another sequence number must not pass");
        let mut bent = m.clone();
        if let Some(b) = bent.last_mut() {
            *b ^= 1;
            assert!(std::panic::catch_unwind(|| check(&bent, 1, 2, 7, 1 << 16)).is_err());
        }
    }
}
