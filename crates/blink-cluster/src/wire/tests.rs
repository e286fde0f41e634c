use super::*;
use blink_model::RowKind;
use proptest::prelude::*;

fn samples() -> Vec<Message> {
    vec![
        Message::Hello { role: Role::Head, nonce: [7; 32] },
        Message::Hello { role: Role::Peer, nonce: [1; 32] },
        Message::Challenge { nonce: [2; 32], proof: [3; 32] },
        Message::Proof { proof: [4; 32] },
        Message::Refused { reason: "wrong token — go away".into() },
        Message::Assign(Assign {
            model_sha256: [9; 32],
            windows: vec![10, 0, 20],
            rounds: 2,
            me: 2,
            head: Some(1),
            addrs: vec!["127.0.0.1:1".into(), String::new(), "[::1]:2".into()],
            kv_tokens: 4096,
            max_rows: 512,
            max_ctx: 2048,
            kv_f32: true,
            threads: 3,
            memory: 3 << 30,
        }),
        Message::Ready,
        Message::Step(StepFrame {
            id: u64::MAX - 1,
            first_layer: 15,
            ops: vec![
                CacheOp::Truncate { seq: 3, len: 17 },
                CacheOp::Release { seq: 4 },
                CacheOp::Cut { seq: 5, blocks: 2 },
                CacheOp::Block { seq: 5, block: 901 },
                CacheOp::Copy { src: 7, dst: 901, slots: 9 },
            ],
            rows: vec![WireRow { seq: 3, pos: 17, kind: RowKind::Decode }, WireRow { seq: 5, pos: 0, kind: RowKind::Prompt }],
            hidden: vec![1.5, -0.0, f32::MIN_POSITIVE, 3.25, 1e30, -7.0],
        }),
        Message::Step(StepFrame::default()),
        Message::Failed { id: 12, reason: "context full".into() },
        Message::Ping { at: 99 },
        Message::Pong { at: 100 },
    ]
}

fn roundtrip(bytes: &[u8], max: usize) -> Result<Message, WireError> {
    let header: [u8; HEADER] = bytes.get(..HEADER).ok_or(WireError::Truncated("header"))?.try_into().unwrap();
    let h = Header::parse(&header, max)?;
    decode(h, &bytes[HEADER..])
}

#[test]
fn every_message_survives_the_wire() {
    let mut buf = Vec::new();
    for m in samples() {
        encode(&m, &mut buf);
        assert_eq!(roundtrip(&buf, MAX_PAYLOAD).unwrap(), m);
    }
}

#[test]
fn a_cut_frame_is_refused_at_every_length() {
    let mut buf = Vec::new();
    for m in samples() {
        encode(&m, &mut buf);
        for cut in 0..buf.len() {
            assert!(roundtrip(&buf[..cut], MAX_PAYLOAD).is_err(), "{} cut at {cut}", m.name());
        }
        // The payload as a frame of a longer length, and trailing bytes.
        let mut long = buf.clone();
        long.push(0);
        assert!(roundtrip(&long, MAX_PAYLOAD).is_err(), "{} with a byte more", m.name());
    }
}

#[test]
fn headers_name_what_is_wrong() {
    let mut buf = Vec::new();
    encode(&Message::Ping { at: 1 }, &mut buf);
    let header = |b: &[u8]| -> [u8; HEADER] { b[..HEADER].try_into().unwrap() };
    let mut bad = buf.clone();
    bad[0] = b'G';
    assert!(matches!(Header::parse(&header(&bad), MAX_PAYLOAD), Err(WireError::Magic(_))));
    let mut bad = buf.clone();
    bad[4] = 2;
    assert_eq!(Header::parse(&header(&bad), MAX_PAYLOAD), Err(WireError::Version { got: 2 }));
    assert!(WireError::Version { got: 2 }.to_string().contains("version 2"));
    let mut bad = buf.clone();
    bad[6] = 200;
    assert_eq!(Header::parse(&header(&bad), MAX_PAYLOAD), Err(WireError::Kind(200)));
    let mut bad = buf.clone();
    bad[8..12].copy_from_slice(&(MAX_PAYLOAD as u32 + 1).to_le_bytes());
    assert!(matches!(Header::parse(&header(&bad), usize::MAX), Err(WireError::TooLarge { .. })));
    // A connection's own bound is lower than the format's.
    assert!(matches!(Header::parse(&header(&buf), 4), Err(WireError::TooLarge { len: 8, max: 4 })));
}

#[test]
fn a_count_larger_than_the_frame_allocates_nothing() {
    // A step claiming four billion rows in a few bytes.
    let mut w = Writer::default();
    w.u64(1);
    w.u32(0);
    w.u32(0);
    w.u32(u32::MAX);
    let payload = w.buf;
    let h = Header { kind: 7, len: payload.len() };
    assert_eq!(decode(h, &payload), Err(WireError::Truncated("rows")));
}

proptest! {
    #[test]
    fn garbage_is_an_error_never_a_panic(kind in 0u8..12, payload in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = decode(Header { kind, len: payload.len() }, &payload);
    }

    #[test]
    fn flipped_bytes_are_an_error_or_a_frame(which in 0usize..12, at in any::<prop::sample::Index>(), bit in 0u8..8) {
        let mut buf = Vec::new();
        encode(&samples()[which], &mut buf);
        let i = at.index(buf.len());
        buf[i] ^= 1 << bit;
        let _ = roundtrip(&buf, MAX_PAYLOAD);
    }
}
