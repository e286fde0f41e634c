use super::*;
use std::time::Instant;
use tokio::net::TcpListener;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

fn token(s: &str) -> Token {
    Token::new(s).unwrap()
}

/// A listener on a free loopback port, and its address.
async fn listener() -> (TcpListener, String) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    (listener, addr)
}

/// A task that accepts one connection proving `t`, with frames of up to `max` bytes, and
/// then runs `then` on it.
fn serve_one<T, F, Fut>(listener: TcpListener, t: &Token, max: usize, then: F) -> tokio::task::JoinHandle<T>
where
    F: FnOnce(FrameReader, FrameWriter, Role) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = T> + Send,
    T: Send + 'static,
{
    let t = t.clone();
    tokio::spawn(async move {
        let (s, _) = listener.accept().await.unwrap();
        let (r, w, role) = accept(s, &t, max).await.unwrap();
        then(r, w, role).await
    })
}

#[test]
fn both_sides_prove_the_token_and_frames_flow() {
    rt().block_on(async {
        let (listener, addr) = listener().await;
        let t = token("a ring token of enough bytes");
        let server = serve_one(listener, &t, 1 << 20, |mut r, mut w, role| async move {
            assert_eq!(role, Role::Head);
            let m = r.read().await.unwrap();
            w.send(&m).await.unwrap();
        });
        let (mut r, mut w) = connect(&addr, &t, Role::Head, 1 << 20).await.unwrap();
        w.send(&Message::Ping { at: 42 }).await.unwrap();
        assert_eq!(r.read().await.unwrap(), Message::Ping { at: 42 });
        server.await.unwrap();
    });
}

#[test]
fn a_wrong_token_is_refused_on_both_sides() {
    rt().block_on(async {
        let (listener, addr) = listener().await;
        let server = tokio::spawn(async move {
            let (s, _) = listener.accept().await.unwrap();
            accept(s, &token("the listener's token, long"), 1 << 20).await.err()
        });
        let client = connect(&addr, &token("the stranger's token, long"), Role::Peer, 1 << 20).await;
        // The stranger sees the listener's proof fail first and refuses it.
        assert!(matches!(client, Err(LinkError::BadProof)), "{:?}", client.err());
        let server = server.await.unwrap();
        assert!(server.is_some(), "the listener must not accept the stranger");
    });
}

#[test]
fn garbage_and_silence_close_the_connection_with_an_error() {
    rt().block_on(async {
        let (listener, addr) = listener().await;
        let t = token("a ring token of enough bytes");
        let server = tokio::spawn(async move {
            let mut errors = Vec::new();
            for _ in 0..3 {
                let (s, _) = listener.accept().await.unwrap();
                errors.push(accept(s, &t, 1 << 20).await.err().map(|e| e.to_string()));
            }
            errors
        });
        // An HTTP request, a frame of another version, a claim of a huge frame.
        let mut s = TcpStream::connect(&addr).await.unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
        let mut s2 = TcpStream::connect(&addr).await.unwrap();
        let mut frame = Vec::new();
        wire::encode(&Message::Hello { role: Role::Head, nonce: [0; 32] }, &mut frame);
        frame[4] = 9;
        s2.write_all(&frame).await.unwrap();
        let mut s3 = TcpStream::connect(&addr).await.unwrap();
        wire::encode(&Message::Hello { role: Role::Head, nonce: [0; 32] }, &mut frame);
        frame[8..12].copy_from_slice(&(1u32 << 30).to_le_bytes());
        s3.write_all(&frame).await.unwrap();
        let errors = server.await.unwrap();
        assert!(errors[0].as_deref().unwrap().contains("not a Blink ring frame"), "{errors:?}");
        assert!(errors[1].as_deref().unwrap().contains("version 9"), "{errors:?}");
        assert!(errors[2].as_deref().unwrap().contains("exceeds the bound"), "{errors:?}");
        drop((s, s2, s3));
    });
}

#[test]
fn a_shim_delays_frames_as_a_slow_wire_would() {
    rt().block_on(async {
        let (listener, addr) = listener().await;
        let t = token("a ring token of enough bytes");
        let server = serve_one(listener, &t, 1 << 24, |r, _w, _| async move {
            // 40 ms per frame, and 8 Mbit/s: a 100 kB frame takes 100 ms to carry.
            let mut r = Incoming::new(r, Shim::new(40.0, 8.0).unwrap());
            let start = Instant::now();
            let mut at = Vec::new();
            for _ in 0..3 {
                r.read().await.unwrap();
                at.push(start.elapsed());
            }
            at
        });
        let (_r, mut w) = connect(&addr, &t, Role::Head, 1 << 24).await.unwrap();
        // Two small frames at once, then a large one.
        w.send(&Message::Ping { at: 1 }).await.unwrap();
        w.send(&Message::Ping { at: 2 }).await.unwrap();
        w.send(&Message::Refused { reason: "x".repeat(100_000) }).await.unwrap();
        let at = server.await.unwrap();
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        // The small frames land together after the latency, not one latency apart.
        assert!((39.0..90.0).contains(&ms(at[0])), "{at:?}");
        assert!(ms(at[1]) - ms(at[0]) < 30.0, "{at:?}");
        // The large one waits for its 100 ms on the wire, then the latency.
        assert!((135.0..260.0).contains(&ms(at[2])), "{at:?}");
    });
}
