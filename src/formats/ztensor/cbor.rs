//! The few CBOR items a v1.0 manifest is made of, encoded the way serde_cbor 0.11 encodes them
//! for crate 1.0.0: definite lengths and the shortest head for every length and integer. Written
//! by hand so that the bytes stay identical whatever a CBOR library's defaults become.

const UINT: u8 = 0;
const TEXT: u8 = 3;
const ARRAY: u8 = 4;
const MAP: u8 = 5;

fn head(out: &mut Vec<u8>, major: u8, n: u64) {
    let m = major << 5;
    if n < 24 {
        out.push(m | n as u8);
    } else if n <= u8::MAX as u64 {
        out.extend_from_slice(&[m | 24, n as u8]);
    } else if n <= u16::MAX as u64 {
        out.push(m | 25);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    } else if n <= u32::MAX as u64 {
        out.push(m | 26);
        out.extend_from_slice(&(n as u32).to_be_bytes());
    } else {
        out.push(m | 27);
        out.extend_from_slice(&n.to_be_bytes());
    }
}

pub fn uint(out: &mut Vec<u8>, n: u64) {
    head(out, UINT, n);
}

pub fn text(out: &mut Vec<u8>, s: &str) {
    head(out, TEXT, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

pub fn array(out: &mut Vec<u8>, len: usize) {
    head(out, ARRAY, len as u64);
}

pub fn map(out: &mut Vec<u8>, len: usize) {
    head(out, MAP, len as u64);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_are_shortest_form() {
        let enc = |n| {
            let mut v = Vec::new();
            uint(&mut v, n);
            v
        };
        assert_eq!(enc(23), [0x17]);
        assert_eq!(enc(24), [0x18, 24]);
        assert_eq!(enc(256), [0x19, 1, 0]);
        assert_eq!(enc(65536), [0x1a, 0, 1, 0, 0]);
        assert_eq!(enc(1 << 32), [0x1b, 0, 0, 0, 1, 0, 0, 0, 0]);
        let mut v = Vec::new();
        text(&mut v, "dense");
        assert_eq!(v, b"\x65dense");
    }
}
