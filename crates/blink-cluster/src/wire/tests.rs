use super::*;
use blink_model::lora::LoraPair;
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
            mixes: vec![vec![MixPart { adapter: 7, scale: 1.0 }], vec![MixPart { adapter: 7, scale: 0.5 }, MixPart { adapter: u64::MAX, scale: -2.0 }]],
            rows: vec![
                WireRow { seq: 3, pos: 17, kind: RowKind::Decode, adapter: Some(1), logits: true, grouped: false, tiled: true },
                WireRow { seq: 5, pos: 0, kind: RowKind::Prompt, adapter: None, logits: false, grouped: true, tiled: false },
                WireRow { seq: 6, pos: 2, kind: RowKind::Prompt, adapter: Some(0), logits: true, grouped: true, tiled: true },
            ],
            hidden: vec![1.5, -0.0, f32::MIN_POSITIVE, 3.25, 1e30, -7.0, 0.0, 1.0, 2.0],
        }),
        Message::Step(StepFrame::default()),
        Message::Failed { id: 12, reason: "context full".into() },
        Message::Ping { at: 99 },
        Message::Pong { at: 100 },
        Message::AdapterLayer(Box::new(AdapterLayer {
            adapter: 7,
            layer: 29,
            pairs: [
                None,
                Some(LoraPair { rank: 2, rows: 3, cols: 1, a: vec![0.5, -1.0], b: vec![65504.0, 0.0, -0.25, 1.0, 2.0, 6.1035156e-5] }),
                None,
                None,
                None,
                None,
                Some(LoraPair { rank: 1, rows: 1, cols: 2, a: vec![3.0, 4.0], b: vec![-5.0] }),
            ],
        })),
        Message::AdapterLayer(Box::new(AdapterLayer { adapter: 1, layer: 0, pairs: Default::default() })),
        Message::AdapterPlace { adapter: 7, alpha: 16.0, rslora: true },
        Message::AdapterPlaced { adapter: 7, error: String::new() },
        Message::AdapterPlaced { adapter: 8, error: "no memory".into() },
        Message::AdapterDrop { adapter: 7 },
    ]
}

fn roundtrip(bytes: &[u8], max: usize) -> Result<Message, WireError> {
    roundtrip_in(bytes, max, &FramePool::default())
}

/// `bytes` decoded with a step's buffers from `pool`.
fn roundtrip_in(bytes: &[u8], max: usize, pool: &FramePool) -> Result<Message, WireError> {
    let header: [u8; HEADER] = bytes.get(..HEADER).ok_or(WireError::Truncated("header"))?.try_into().unwrap();
    let h = Header::parse(&header, max)?;
    decode(h, &bytes[HEADER..], pool)
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
fn a_reused_frame_carries_nothing_of_the_step_before() {
    // The samples' steps, and one with a single mix of three parts (more than the first
    // mix of the step before it has room for) and one row.
    let mut steps: Vec<Message> = samples().into_iter().filter(|m| matches!(m, Message::Step(_))).collect();
    let parts = (1..4).map(|a| MixPart { adapter: a, scale: a as f32 }).collect();
    let row = WireRow { seq: 1, pos: 2, kind: RowKind::Training, adapter: Some(0), logits: false, grouped: false, tiled: false };
    steps.insert(1, Message::Step(StepFrame { id: 5, first_layer: 2, ops: vec![CacheOp::Release { seq: 1 }], mixes: vec![parts], rows: vec![row], hidden: vec![0.5; 4] }));
    let pool = FramePool::new();
    let mut buf = Vec::new();
    // Each in turn, forwards, backwards and forwards again, every decoded step given back
    // for the next to reuse.
    for m in steps.iter().chain(steps.iter().rev()).chain(&steps) {
        encode(m, &mut buf);
        let got = roundtrip_in(&buf, MAX_PAYLOAD, &pool).unwrap();
        assert_eq!(&got, m);
        pool.recycle(got);
        assert_eq!(pool.spares(), 1, "the frame went back");
        // A step cut short (its header saying so) gives its frame back too.
        let mut cut = buf[..buf.len() - 1].to_vec();
        let len = (cut.len() - HEADER) as u32;
        cut[8..12].copy_from_slice(&len.to_le_bytes());
        assert!(matches!(roundtrip_in(&cut, MAX_PAYLOAD, &pool), Err(WireError::Truncated(_))));
        assert_eq!(pool.spares(), 1, "a refused step's frame went back");
        // And one with a byte too many.
        let mut long = buf.clone();
        long.push(0);
        let len = (long.len() - HEADER) as u32;
        long[8..12].copy_from_slice(&len.to_le_bytes());
        assert!(matches!(roundtrip_in(&long, MAX_PAYLOAD, &pool), Err(WireError::Invalid(_))));
        assert_eq!(pool.spares(), 1, "a step with bytes left over gave its frame back");
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
    bad[4] = 1;
    assert_eq!(Header::parse(&header(&bad), MAX_PAYLOAD), Err(WireError::Version { got: 1 }));
    assert!(WireError::Version { got: 1 }.to_string().contains("version 1"));
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
    w.u32(0);
    w.u32(u32::MAX);
    let payload = w.buf;
    let h = Header { kind: 7, len: payload.len() };
    assert_eq!(decode(h, &payload, &FramePool::default()), Err(WireError::Truncated("rows")));
}

#[test]
fn adapters_on_the_wire_must_agree_with_themselves() {
    let mut buf = Vec::new();
    // A row naming a mix the step does not carry.
    let step = StepFrame { rows: vec![WireRow { seq: 0, pos: 0, kind: RowKind::Decode, adapter: Some(0), logits: false, grouped: false, tiled: false }], hidden: vec![0.0], ..StepFrame::default() };
    encode(&Message::Step(step), &mut buf);
    assert!(matches!(roundtrip(&buf, MAX_PAYLOAD), Err(WireError::Invalid(e)) if e.contains("adapter mix 0")));
    // A pair whose values do not fill its shape.
    let pair = LoraPair { rank: 2, rows: 2, cols: 2, a: vec![1.0; 4], b: vec![1.0; 3] };
    let mut pairs: [Option<LoraPair>; 7] = Default::default();
    pairs[0] = Some(pair);
    encode(&Message::AdapterLayer(Box::new(AdapterLayer { adapter: 1, layer: 0, pairs })), &mut buf);
    assert!(matches!(roundtrip(&buf, MAX_PAYLOAD), Err(WireError::Invalid(e)) if e.contains("rank 2")));
}

proptest! {
    #[test]
    fn garbage_is_an_error_never_a_panic(kind in 0u8..16, payload in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = decode(Header { kind, len: payload.len() }, &payload, &FramePool::default());
    }

    #[test]
    fn flipped_bytes_are_an_error_or_a_frame(which in 0usize..18, at in any::<prop::sample::Index>(), bit in 0u8..8) {
        let mut buf = Vec::new();
        encode(&samples()[which], &mut buf);
        let i = at.index(buf.len());
        buf[i] ^= 1 << bit;
        let _ = roundtrip(&buf, MAX_PAYLOAD);
    }
}
