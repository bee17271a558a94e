//! Identifiers of the EC channel, stored compactly.
//!
//! Transfer ids are `uuid4().hex` in practice (32 lowercase hex chars) but any string is
//! legal on the wire; reservation ids are always minted here as `uuid4().hex`. Keeping the
//! common form as 16 raw bytes is what holds a live reservation under 256 bytes.

use rand_core::RngCore;
use std::fmt;

/// A transfer id: any string, held as 16 bytes when it is 32 lowercase hex digits.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum TransferId {
    /// The canonical `uuid4().hex` shape.
    Hex([u8; 16]),
    /// Anything else, verbatim.
    Text(Box<str>),
}

impl TransferId {
    /// Wraps a wire string; the same string always yields the same variant.
    pub fn new(s: &str) -> Self {
        match parse_hex32(s) {
            Some(bytes) => TransferId::Hex(bytes),
            None => TransferId::Text(s.into()),
        }
    }
}

/// One write per id (the derived hash writes a tag, a length and the bytes): the book
/// hashes a transfer id on every operation. The two variants never hold the same string.
impl std::hash::Hash for TransferId {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        match self {
            TransferId::Hex(bytes) => state.write(bytes),
            TransferId::Text(s) => {
                state.write_u8(0xff);
                state.write(s.as_bytes());
            }
        }
    }
}

impl From<&str> for TransferId {
    fn from(s: &str) -> Self {
        TransferId::new(s)
    }
}

impl fmt::Display for TransferId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TransferId::Hex(bytes) => write_hex(f, bytes),
            TransferId::Text(s) => f.write_str(s),
        }
    }
}

impl fmt::Debug for TransferId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.to_string())
    }
}

/// A reservation id: 128 random bits shaped like a version-4 UUID, shown as 32 hex chars.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ReservationId([u8; 16]);

impl ReservationId {
    /// Mints a fresh id from the injected RNG (the OS CSPRNG in production, a seeded
    /// stream in the simulator), with the UUID version and variant bits `uuid4()` sets.
    pub fn generate<R: RngCore + ?Sized>(rng: &mut R) -> Self {
        let mut bytes = [0u8; 16];
        rng.fill_bytes(&mut bytes);
        bytes[6] = (bytes[6] & 0x0f) | 0x40;
        bytes[8] = (bytes[8] & 0x3f) | 0x80;
        ReservationId(bytes)
    }

    /// Parses the wire form; anything that is not 32 lowercase hex chars names no
    /// reservation this server minted.
    pub fn parse(s: &str) -> Option<Self> {
        parse_hex32(s).map(ReservationId)
    }

    /// The wire form as a `String`, without `fmt`.
    pub fn to_hex_string(&self) -> String {
        // One pass over 32 bytes: hex digits are all one-byte chars.
        self.to_hex().iter().map(|&b| char::from(b)).collect()
    }

    /// The wire form (32 lowercase hex digits) as bytes, for writers that skip `fmt`.
    pub fn to_hex(&self) -> [u8; 32] {
        let mut out = [0u8; 32];
        hex_into(&mut out, &self.0);
        out
    }
}

impl fmt::Display for ReservationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_hex(f, &self.0)
    }
}

impl fmt::Debug for ReservationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ReservationId({self})")
    }
}

/// An `mm_hash`: any string, held inline when it is 64 lowercase hex chars (a sha256
/// hex digest, what vLLM uses), else shared text.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MmHash {
    /// The sha256-hex shape.
    Hex([u8; 32]),
    /// Anything else, verbatim.
    Text(std::sync::Arc<str>),
}

impl MmHash {
    /// Wraps a wire string; the same string always yields the same variant.
    pub fn new(s: &str) -> Self {
        match parse_hex::<32>(s) {
            Some(bytes) => MmHash::Hex(bytes),
            None => MmHash::Text(s.into()),
        }
    }

    /// Whether this is the hash `s` names.
    pub fn matches(&self, s: &str) -> bool {
        match self {
            MmHash::Hex(bytes) => parse_hex::<32>(s).is_some_and(|b| &b == bytes),
            MmHash::Text(t) => &**t == s,
        }
    }

    /// The text as a shared string.
    pub fn to_arc(&self) -> std::sync::Arc<str> {
        match self {
            MmHash::Hex(_) => self.to_string().into(),
            MmHash::Text(t) => t.clone(),
        }
    }

    /// A fixed, seedless hash of the text, so indexes built on it iterate the same way
    /// in every run: the digest's own bits for the sha256-hex shape (folded, so it costs
    /// a few instructions on every completion), FNV-1a of the text otherwise.
    pub fn fingerprint(&self) -> u64 {
        match self {
            MmHash::Hex(bytes) => fold_digest(bytes),
            MmHash::Text(t) => fnv_str(t),
        }
    }
}

/// The four words of a digest, XORed (a collision only costs a comparison).
fn fold_digest(bytes: &[u8; 32]) -> u64 {
    bytes.chunks_exact(8).fold(0, |acc, w| {
        let mut word = [0u8; 8];
        word.copy_from_slice(w);
        acc ^ u64::from_le_bytes(word)
    })
}

fn fnv_str(s: &str) -> u64 {
    s.bytes().fold(FNV_OFFSET, fnv)
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

fn fnv(h: u64, b: u8) -> u64 {
    (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
}

/// [`MmHash::fingerprint`] of a wire string.
pub fn fingerprint_str(s: &str) -> u64 {
    match parse_hex::<32>(s) {
        Some(bytes) => fold_digest(&bytes),
        None => fnv_str(s),
    }
}

impl fmt::Display for MmHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MmHash::Hex(bytes) => write_hex(f, bytes),
            MmHash::Text(s) => f.write_str(s),
        }
    }
}

impl fmt::Debug for MmHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.to_string())
    }
}

fn parse_hex32(s: &str) -> Option<[u8; 16]> {
    parse_hex::<16>(s)
}

fn parse_hex<const N: usize>(s: &str) -> Option<[u8; N]> {
    let b = s.as_bytes();
    if b.len() != 2 * N {
        return None;
    }
    if N % 4 != 0 {
        return parse_hex_bytewise(b);
    }
    let mut out = [0u8; N];
    for (o, chunk) in out.chunks_exact_mut(4).zip(b.chunks_exact(8)) {
        o.copy_from_slice(&hex8(chunk)?);
    }
    Some(out)
}

/// Eight lowercase hex digits to four bytes, eight at a time in one word (ids are
/// parsed on every request, and bytewise this was ~15 instructions a digit).
#[inline(always)]
fn hex8(chunk: &[u8]) -> Option<[u8; 4]> {
    const L: u64 = 0x0101_0101_0101_0101;
    const H: u64 = 0x8080_8080_8080_8080;
    let mut word = [0u8; 8];
    word.copy_from_slice(chunk);
    let v = u64::from_le_bytes(word);
    // The high bit of each byte of `ge(k)` is set iff that byte is >= k (for bytes below
    // 0x80 and k <= 0x80: the subtraction never borrows across bytes).
    let ge = |k: u64| ((v | H) - k * L) & H;
    let digit = ge(0x30) & !ge(0x3a);
    let lower = ge(0x61) & !ge(0x67);
    if v & H != 0 || (digit | lower) != H {
        return None;
    }
    // Each byte's value: its low nibble, plus 9 for 'a'..='f'.
    let val = (v & (0x0f * L)) + (lower >> 7) * 9;
    // Even bytes are high nibbles: each 16-bit lane's low byte becomes one output byte.
    const LANES: u64 = 0x00ff_00ff_00ff_00ff;
    let x = ((val & LANES) << 4) | ((val >> 8) & LANES);
    let x = (x | (x >> 8)) & 0x0000_ffff_0000_ffff;
    let x = (x | (x >> 16)) & 0x0000_0000_ffff_ffff;
    Some((x as u32).to_le_bytes())
}

/// [`parse_hex`] a byte pair at a time (`b` holds `2 * N` bytes).
fn parse_hex_bytewise<const N: usize>(b: &[u8]) -> Option<[u8; N]> {
    // Branch-free per byte: a table maps lowercase hex digits to their value and every
    // other byte to a bit (0x10) that survives the OR and refuses the whole id.
    const BAD: u8 = 0x10;
    const NIBBLE: [u8; 256] = {
        let mut t = [BAD; 256];
        let mut c = 0;
        while c < 10 {
            t[b'0' as usize + c] = c as u8;
            c += 1;
        }
        let mut c = 0;
        while c < 6 {
            t[b'a' as usize + c] = 10 + c as u8;
            c += 1;
        }
        t
    };
    let mut out = [0u8; N];
    let mut bad = 0u8;
    for (o, pair) in out.iter_mut().zip(b.chunks_exact(2)) {
        let (hi, lo) = (NIBBLE[usize::from(pair[0])], NIBBLE[usize::from(pair[1])]);
        bad |= hi | lo;
        *o = (hi << 4) | (lo & 0x0f);
    }
    (bad & BAD == 0).then_some(out)
}

/// Lowercase hex of `bytes` in one `write_str` (formatting byte by byte through
/// `fmt` costs several times more, and ids are written on every reply).
fn write_hex(f: &mut fmt::Formatter<'_>, bytes: &[u8]) -> fmt::Result {
    let mut buf = [0u8; 64];
    let n = bytes.len().min(32);
    hex_into(&mut buf[..2 * n], &bytes[..n]);
    f.write_str(std::str::from_utf8(&buf[..2 * n]).map_err(|_| fmt::Error)?)
}

/// Lowercase hex of `bytes` into `out` (twice as long): one table load per byte.
pub(crate) fn hex_into(out: &mut [u8], bytes: &[u8]) {
    const PAIRS: [[u8; 2]; 256] = {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut t = [[0u8; 2]; 256];
        let mut b = 0;
        while b < 256 {
            t[b] = [HEX[b >> 4], HEX[b & 0x0f]];
            b += 1;
        }
        t
    };
    for (pair, b) in out.chunks_exact_mut(2).zip(bytes) {
        pair.copy_from_slice(&PAIRS[usize::from(*b)]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_chacha::rand_core::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn transfer_ids_keep_their_text() {
        for s in ["3f2a9c1e3f2a9c1e3f2a9c1e3f2a9c1e", "3F2A9C1E3F2A9C1E3F2A9C1E3F2A9C1E", "req-1:0", "", "None"] {
            assert_eq!(TransferId::new(s).to_string(), s);
        }
        assert!(matches!(TransferId::new("3f2a9c1e3f2a9c1e3f2a9c1e3f2a9c1e"), TransferId::Hex(_)));
        assert!(matches!(TransferId::new("3F2A9C1E3F2A9C1E3F2A9C1E3F2A9C1E"), TransferId::Text(_)));
    }

    #[test]
    fn mm_hashes_keep_their_text_and_fingerprint_alike() {
        let hex = "9c1e".repeat(16);
        for s in [hex.as_str(), "h1", "", "9C1E"] {
            let h = MmHash::new(s);
            assert_eq!(h.to_string(), s);
            assert!(h.matches(s));
            assert_eq!(h.fingerprint(), fingerprint_str(s));
            assert_eq!(&*h.to_arc(), s);
        }
        assert!(matches!(MmHash::new(&hex), MmHash::Hex(_)));
        assert!(!MmHash::new(&hex).matches("h1"));
    }

    #[test]
    fn reservation_ids_look_like_uuid4_hex() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let id = ReservationId::generate(&mut rng).to_string();
        assert_eq!(id.len(), 32);
        assert!(id.bytes().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)));
        assert_eq!(&id[12..13], "4");
        assert!(matches!(&id[16..17], "8" | "9" | "a" | "b"));
        assert_eq!(ReservationId::parse(&id).map(|r| r.to_hex_string()), Some(id.clone()));
        assert_eq!(ReservationId::parse(&id).map(|r| r.to_string()), Some(id));
        for bad in [
            "",
            "0",
            &"g".repeat(32),
            &"A".repeat(32),
            &"0".repeat(31),
            &"0".repeat(33),
            &"/".repeat(32),
            &":".repeat(32),
        ] {
            assert_eq!(ReservationId::parse(bad), None, "{bad:?}");
        }
        assert_eq!(parse_hex::<2>("09af"), Some([0x09, 0xaf]));
    }

    #[test]
    fn word_at_a_time_hex_parses_as_the_bytewise_one() {
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let alphabet = b"0123456789abcdefABCDEF/:@`gG \x7f\x80\xff\x00";
        for round in 0..20_000 {
            let mut b = [0u8; 32];
            rng.fill_bytes(&mut b);
            let text: Vec<u8> = if round % 2 == 0 {
                // Mostly valid digits, now and then one odd byte.
                let mut t: Vec<u8> = b.iter().map(|x| b"0123456789abcdef"[usize::from(x & 15)]).collect();
                if round % 4 == 0 {
                    let at = usize::from(b[0]) % 32;
                    t[at] = alphabet[usize::from(b[1]) % alphabet.len()];
                }
                t
            } else {
                b.iter().map(|x| alphabet[usize::from(*x) % alphabet.len()]).collect()
            };
            let expected = parse_hex_bytewise::<16>(&text);
            let s = String::from_utf8_lossy(&text);
            if s.len() == 32 {
                assert_eq!(parse_hex::<16>(&s), expected, "{s:?}");
            }
        }
        let id = "0123456789abcdeffedcba9876543210";
        assert_eq!(
            parse_hex32(id).map(|b| {
                let mut o = [0u8; 32];
                hex_into(&mut o, &b);
                o
            }),
            Some(*b"0123456789abcdeffedcba9876543210")
        );
    }
}
