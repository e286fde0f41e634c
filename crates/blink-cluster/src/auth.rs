//! Proving the ring's shared token without sending it.
//!
//! The connecting side sends a fresh nonce; the listening side answers with its own and
//! an HMAC-SHA256 of both under the token, labelled "server"; the connecting side checks
//! it and answers with the HMAC labelled "client". Each side has then shown it holds the
//! token, no token crossed the wire, and a recorded exchange is worthless with other
//! nonces. Proofs are compared in constant time.

use std::path::Path;

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The shortest token accepted: a guessable secret protects nothing.
pub const MIN_TOKEN_BYTES: usize = 16;

/// The ring's shared secret.
#[derive(Clone)]
pub struct Token(Vec<u8>);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(…)")
    }
}

impl Token {
    /// A token from its file's text (surrounding whitespace dropped).
    pub fn new(text: &str) -> Result<Token, String> {
        let t = text.trim();
        if t.len() < MIN_TOKEN_BYTES {
            return Err(format!("the ring token has {} bytes; use at least {MIN_TOKEN_BYTES} (say, `head -c 32 /dev/urandom | base64`)", t.len()));
        }
        Ok(Token(t.as_bytes().to_vec()))
    }

    /// The token in the file at `path`.
    pub fn read(path: &Path) -> Result<Token, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read the token file {}: {e}", path.display()))?;
        Token::new(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    fn mac(&self, label: &[u8], client: &[u8; 32], server: &[u8; 32]) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        mac.update(b"blink-ring v1 ");
        mac.update(label);
        mac.update(client);
        mac.update(server);
        mac
    }

    /// The listening side's proof for the nonces.
    pub fn server_proof(&self, client: &[u8; 32], server: &[u8; 32]) -> [u8; 32] {
        self.mac(b"server", client, server).finalize().into_bytes().into()
    }

    /// The connecting side's proof for the nonces.
    pub fn client_proof(&self, client: &[u8; 32], server: &[u8; 32]) -> [u8; 32] {
        self.mac(b"client", client, server).finalize().into_bytes().into()
    }

    /// Whether `proof` is the listening side's, in constant time.
    pub fn check_server(&self, client: &[u8; 32], server: &[u8; 32], proof: &[u8; 32]) -> bool {
        self.mac(b"server", client, server).verify_slice(proof).is_ok()
    }

    /// Whether `proof` is the connecting side's, in constant time.
    pub fn check_client(&self, client: &[u8; 32], server: &[u8; 32], proof: &[u8; 32]) -> bool {
        self.mac(b"client", client, server).verify_slice(proof).is_ok()
    }
}

/// A fresh nonce from the OS.
pub fn nonce() -> [u8; 32] {
    let mut n = [0u8; 32];
    getrandom::fill(&mut n).expect("the OS's random source");
    n
}

/// The SHA-256 of a file, read in large pieces (a model's hash, which every device
/// checks against the head's).
pub fn file_sha256(path: &Path) -> std::io::Result<[u8; 32]> {
    use sha2::Digest;
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher.finalize().into())
}

/// A hash as hex, for messages.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proofs_hold_for_the_token_and_nonces_only() {
        let t = Token::new("correct horse battery staple").unwrap();
        let other = Token::new("incorrect horse battery staple").unwrap();
        let (c, s) = (nonce(), nonce());
        assert_ne!(c, s);
        let sp = t.server_proof(&c, &s);
        assert!(t.check_server(&c, &s, &sp));
        assert!(!other.check_server(&c, &s, &sp));
        assert!(!t.check_server(&s, &c, &sp));
        assert!(!t.check_client(&c, &s, &sp), "a server proof is not a client proof");
        let cp = t.client_proof(&c, &s);
        assert!(t.check_client(&c, &s, &cp));
        assert!(!t.check_client(&c, &nonce(), &cp));
    }

    #[test]
    fn short_tokens_are_refused() {
        assert!(Token::new("  short \n").unwrap_err().contains("at least 16"));
        assert!(Token::new("0123456789abcdef\n").is_ok());
    }
}
