//! GitHub's token checksum: the last 6 characters of a `ghp_`/`gho_`/`ghu_`/`ghs_`/`ghr_`
//! token are the CRC32 of its 30 random characters, in base62 (`0-9A-Za-z`), left-padded
//! with `0`. A typo, a truncated token or a made-up string of the right shape fails it.

const BASE62: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// The 6 checksum characters for `random`.
pub(super) fn github_checksum(random: &[u8]) -> [u8; 6] {
    let mut n = crc32fast::hash(random);
    let mut out = [b'0'; 6];
    for slot in out.iter_mut().rev() {
        *slot = BASE62[(n % 62) as usize];
        n /= 62;
    }
    out
}

/// Whether `check` is the checksum of `random`.
pub(super) fn github_checksum_ok(random: &[u8], check: &[u8]) -> bool {
    github_checksum(random) == check
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_is_base62_crc32_left_padded() {
        // CRC32("") = 0: all padding.
        assert_eq!(&github_checksum(b""), b"000000");
        // 62^6 > 2^32, so every CRC fits in 6 characters.
        let c = github_checksum(b"abcdefghijklmnopqrstuvwxyz0123");
        assert!(c.iter().all(|b| b.is_ascii_alphanumeric()));
        let n = c.iter().fold(0u64, |acc, b| {
            acc * 62 + BASE62.iter().position(|x| x == b).unwrap_or(0) as u64
        });
        assert_eq!(
            n,
            u64::from(crc32fast::hash(b"abcdefghijklmnopqrstuvwxyz0123"))
        );
    }
}
