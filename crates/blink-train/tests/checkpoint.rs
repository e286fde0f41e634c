//! Checkpoints: a saved state loads back bit-identically; a save replaces the previous one
//! atomically and leaves no temporary file, even when the disk fills up (a real full tmpfs);
//! a damaged, truncated, foreign or other-version file is a clear error, never a panic.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use blink_model::lora::{LoraFormat, LoraPair, LoraTarget, LoraTensors};
use blink_train::checkpoint::{self, CheckpointError, CurvePoint, TrainState, FILE_NAME};
use safetensors::{Dtype, SafeTensors};

/// A fresh, empty directory for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("blink-ckpt-{}-{name}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

/// xorshift64*: arbitrary but repeatable values.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Any finite f32 bit pattern (subnormals and -0.0 included).
    fn f32(&mut self) -> f32 {
        loop {
            let v = f32::from_bits(self.next() as u32);
            if v.is_finite() {
                return v;
            }
        }
    }

    fn f64(&mut self) -> f64 {
        loop {
            let v = f64::from_bits(self.next());
            if v.is_finite() {
                return v;
            }
        }
    }

    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f32()).collect()
    }
}

/// A run's state: `n_layers` layers with pairs of rank `rank` on some targets (not all, so
/// empty slots round-trip too), moments of `moment_len` values per tensor, a short curve.
fn state(seed: u64, n_layers: usize, rank: usize, moment_len: usize) -> TrainState {
    let mut rng = Rng(seed | 1);
    let (rows, cols) = (24, 16);
    let layers: Vec<[Option<LoraPair>; 7]> = (0..n_layers)
        .map(|l| {
            let mut layer: [Option<LoraPair>; 7] = Default::default();
            for t in [LoraTarget::Q, LoraTarget::V, LoraTarget::Down] {
                if l.is_multiple_of(2) || t != LoraTarget::V {
                    layer[t.index()] = Some(LoraPair { rank, rows, cols, a: rng.vec(rank * cols), b: rng.vec(rows * rank) });
                }
            }
            layer
        })
        .collect();
    let n_tensors = layers.iter().flatten().flatten().count() * 2;
    let curve = (0..5)
        .map(|i| CurvePoint {
            step: i + 1,
            epoch: i / 3,
            train_loss: rng.f64(),
            lr: rng.f64(),
            tokens: 1000 * (i + 1),
            eval_loss: (i % 2 == 1).then(|| rng.f64()),
            eval_accuracy: (i == 3).then_some(0.1 + 0.2),
        })
        .collect();
    TrainState {
        params: LoraTensors { format: LoraFormat::Peft, alpha: 16.5, rslora: seed.is_multiple_of(2), layers },
        adam_steps: 7 + seed,
        adam_m: (0..n_tensors).map(|_| rng.vec(moment_len)).collect(),
        adam_v: (0..n_tensors).map(|_| rng.vec(moment_len)).collect(),
        step: 7 + seed,
        epoch: 1,
        batch: 3,
        trained_tokens: u64::MAX - seed,
        curve,
        fingerprint: format!("sha256:{seed:064x}"),
    }
}

fn f32_bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Every float of both states has the same bits (PartialEq says -0.0 == 0.0 and NaN != NaN).
fn assert_same_bits(a: &TrainState, b: &TrainState) {
    assert_eq!(a.params.alpha.to_bits(), b.params.alpha.to_bits());
    assert_eq!(a.params.layers.len(), b.params.layers.len());
    for (la, lb) in a.params.layers.iter().zip(&b.params.layers) {
        for (pa, pb) in la.iter().zip(lb) {
            assert_eq!(pa.is_some(), pb.is_some());
            if let (Some(pa), Some(pb)) = (pa, pb) {
                assert_eq!((pa.rank, pa.rows, pa.cols), (pb.rank, pb.rows, pb.cols));
                assert_eq!(f32_bits(&pa.a), f32_bits(&pb.a));
                assert_eq!(f32_bits(&pa.b), f32_bits(&pb.b));
            }
        }
    }
    for (ma, mb) in a.adam_m.iter().chain(&a.adam_v).zip(b.adam_m.iter().chain(&b.adam_v)) {
        assert_eq!(f32_bits(ma), f32_bits(mb));
    }
    assert_eq!((a.adam_m.len(), a.adam_v.len()), (b.adam_m.len(), b.adam_v.len()));
    let curve_bits = |s: &TrainState| -> Vec<Option<u64>> {
        let row = |c: &CurvePoint| [Some(c.step), Some(c.epoch), Some(c.train_loss.to_bits()), Some(c.lr.to_bits()), Some(c.tokens), c.eval_loss.map(f64::to_bits), c.eval_accuracy.map(f64::to_bits)];
        s.curve.iter().flat_map(row).collect()
    };
    assert_eq!(curve_bits(a), curve_bits(b));
}

/// The names in `dir`, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    names
}

#[test]
fn a_saved_state_loads_back_bit_identically() {
    let dir = scratch("round-trip");
    for seed in [1, 2] {
        let s = state(seed, 3, 4, 33);
        checkpoint::save(&dir, &s).unwrap();
        let back = checkpoint::load(&dir).unwrap().expect("a checkpoint");
        assert_eq!(back, s);
        assert_same_bits(&back, &s);
    }
    assert_eq!(listing(&dir), [FILE_NAME]);
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_file_is_plain_safetensors_with_the_documented_names() {
    let dir = scratch("layout");
    let s = state(3, 2, 4, 5);
    checkpoint::save(&dir, &s).unwrap();
    let bytes = fs::read(dir.join(FILE_NAME)).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let q = st.tensor("blk.1.attn_q.lora_a").unwrap();
    assert_eq!((q.dtype(), q.shape()), (Dtype::F32, &[4usize, 16][..]));
    assert_eq!(st.tensor("blk.0.ffn_down.lora_b").unwrap().shape(), [24, 4]);
    assert!(st.tensor("blk.1.attn_v.lora_a").is_err(), "layer 1 has no V pair");
    assert_eq!(st.tensor("adam_v.9").unwrap().shape(), [5]);
    assert_eq!(st.len(), 10 + 20);
    let (_, meta) = SafeTensors::read_metadata(&bytes).unwrap();
    let meta = meta.metadata().clone().unwrap();
    assert_eq!(meta["blink.checkpoint.version"], checkpoint::FORMAT_VERSION.to_string());
    assert_eq!(meta["fingerprint"], s.fingerprint);
    assert_eq!(meta["step"], "10");
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn nan_and_infinities_do_not_panic_and_keep_their_bits() {
    let dir = scratch("nan");
    let mut s = state(5, 1, 2, 4);
    s.params.layers[0][0].as_mut().unwrap().a[0] = f32::from_bits(0x7fc0_1234);
    s.params.alpha = f32::INFINITY;
    s.adam_v[0][1] = -f32::NAN;
    s.curve[0].train_loss = f64::NAN;
    s.curve[1].eval_loss = Some(f64::NEG_INFINITY);
    checkpoint::save(&dir, &s).unwrap();
    assert_same_bits(&checkpoint::load(&dir).unwrap().unwrap(), &s);
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_save_replaces_the_previous_checkpoint_and_leaves_one_file() {
    let dir = scratch("overwrite");
    let (first, second) = (state(7, 2, 4, 8), state(8, 3, 2, 3));
    checkpoint::save(&dir, &first).unwrap();
    checkpoint::save(&dir, &second).unwrap();
    let back = checkpoint::load(&dir).unwrap().unwrap();
    assert_eq!(back, second);
    assert_same_bits(&back, &second);
    assert_eq!(listing(&dir), [FILE_NAME]);
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn no_checkpoint_is_none() {
    let dir = scratch("empty");
    assert!(checkpoint::load(&dir).unwrap().is_none());
    assert!(checkpoint::load(&dir.join("never-made")).unwrap().is_none());
    assert!(checkpoint::resume(&dir, "any").unwrap().is_none());
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_corrupted_byte_is_a_checksum_error() {
    let dir = scratch("corrupt");
    checkpoint::save(&dir, &state(9, 1, 2, 3)).unwrap();
    let path = dir.join(FILE_NAME);
    let good = fs::read(&path).unwrap();
    let header_end = 8 + u64::from_le_bytes(good[..8].try_into().unwrap()) as usize;
    // One byte of the adapter's data.
    let mut bad = good.clone();
    bad[header_end + 5] ^= 0x10;
    fs::write(&path, &bad).unwrap();
    let err = checkpoint::load(&dir).unwrap_err();
    assert!(matches!(err, CheckpointError::Checksum { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("corrupted") && msg.contains(&path.display().to_string()), "{msg}");
    // Any one changed byte anywhere, header included, is an error (never a panic or a load).
    for i in 0..good.len() {
        let mut bad = good.clone();
        bad[i] ^= 0x01;
        fs::write(&path, &bad).unwrap();
        match checkpoint::load(&dir) {
            Ok(_) => panic!("byte {i} changed, and it still loaded"),
            Err(e) if i >= header_end => assert!(matches!(e, CheckpointError::Checksum { .. }), "byte {i}: {e}"),
            Err(_) => {}
        }
    }
    fs::remove_dir_all(&dir).unwrap();
}

/// FNV-1a 64 a byte at a time, as format 1 documents its checksum.
fn fnv1a(h: &mut u64, bytes: &[u8]) {
    for &b in bytes {
        *h = (*h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
}

fn fnv1a_field(h: &mut u64, bytes: &[u8]) {
    fnv1a(h, &(bytes.len() as u64).to_le_bytes());
    fnv1a(h, bytes);
}

/// A checkpoint of format 1 (written by builds before version 2, which changed only the
/// checksum) still loads: a saved file made over as version 1, its checksum computed here
/// from the format's documentation.
#[test]
fn a_version_1_checkpoint_still_loads() {
    let dir = scratch("v1");
    let s = state(21, 2, 3, 5);
    checkpoint::save(&dir, &s).unwrap();
    let path = dir.join(FILE_NAME);
    let bytes = fs::read(&path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let data = &bytes[8 + n..];
    let meta = header["__metadata__"].as_object_mut().unwrap();
    assert_eq!(meta["blink.checkpoint.version"], "2");
    meta.insert("blink.checkpoint.version".into(), "1".into());
    meta.remove("checksum");
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    let mut keys: Vec<&String> = meta.keys().collect();
    keys.sort();
    for k in keys {
        fnv1a_field(&mut h, k.as_bytes());
        fnv1a_field(&mut h, meta[k].as_str().unwrap().as_bytes());
    }
    let mut names: Vec<String> = header.keys().filter(|k| *k != "__metadata__").cloned().collect();
    names.sort();
    for name in &names {
        let t = &header[name];
        fnv1a_field(&mut h, name.as_bytes());
        fnv1a_field(&mut h, t["dtype"].as_str().unwrap().as_bytes());
        let shape = t["shape"].as_array().unwrap();
        fnv1a(&mut h, &(shape.len() as u64).to_le_bytes());
        shape.iter().for_each(|d| fnv1a(&mut h, &d.as_u64().unwrap().to_le_bytes()));
        let at = t["data_offsets"].as_array().unwrap();
        fnv1a_field(&mut h, &data[at[0].as_u64().unwrap() as usize..at[1].as_u64().unwrap() as usize]);
    }
    header["__metadata__"].as_object_mut().unwrap().insert("checksum".into(), format!("{h:016x}").into());
    let mut json = serde_json::to_vec(&header).unwrap();
    json.resize(json.len().next_multiple_of(8), b' ');
    let mut v1 = (json.len() as u64).to_le_bytes().to_vec();
    v1.extend_from_slice(&json);
    v1.extend_from_slice(data);
    fs::write(&path, &v1).unwrap();
    assert_same_bits(&checkpoint::load(&dir).unwrap().unwrap(), &s);
    // And its checksum is checked as version 1's: one changed data byte is refused.
    v1[8 + json.len() + 3] ^= 0x40;
    fs::write(&path, &v1).unwrap();
    assert!(matches!(checkpoint::load(&dir).unwrap_err(), CheckpointError::Checksum { .. }));
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_truncated_file_says_so() {
    let dir = scratch("truncated");
    checkpoint::save(&dir, &state(11, 1, 2, 3)).unwrap();
    let path = dir.join(FILE_NAME);
    let good = fs::read(&path).unwrap();
    for len in 0..good.len() {
        fs::write(&path, &good[..len]).unwrap();
        let err = checkpoint::load(&dir).unwrap_err();
        assert!(matches!(err, CheckpointError::Malformed { .. }), "{len}: {err:?}");
        assert!(err.to_string().contains("truncated"), "{len}: {err}");
    }
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_leftover_temporary_file_is_ignored_and_removed() {
    let dir = scratch("leftover");
    let stray = dir.join(format!(".{FILE_NAME}.tmp-4242-1-0"));
    fs::write(&stray, b"half a checkpoint").unwrap();
    assert!(checkpoint::load(&dir).unwrap().is_none());
    assert!(!stray.exists(), "load removes it");

    let s = state(13, 1, 2, 3);
    checkpoint::save(&dir, &s).unwrap();
    fs::write(&stray, b"half a checkpoint").unwrap();
    assert_eq!(checkpoint::load(&dir).unwrap().unwrap(), s);
    assert!(!stray.exists());
    fs::write(&stray, b"half a checkpoint").unwrap();
    checkpoint::save(&dir, &s).unwrap();
    assert_eq!(listing(&dir), [FILE_NAME], "save removes it");
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn another_version_or_a_foreign_file_is_refused() {
    let dir = scratch("version");
    let path = dir.join(FILE_NAME);
    let write = |meta: &[(&str, &str)]| {
        let meta = meta.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let bytes = safetensors::serialize(Vec::<(&str, safetensors::tensor::TensorView)>::new(), Some(meta)).unwrap();
        fs::write(&path, bytes).unwrap();
    };
    write(&[("blink.checkpoint.version", "99"), ("checksum", "0000000000000000")]);
    let err = checkpoint::load(&dir).unwrap_err();
    assert!(matches!(&err, CheckpointError::Version { found, .. } if found == "99"), "{err:?}");
    assert!(err.to_string().contains("version 99"), "{err}");

    write(&[("format", "pt")]);
    let err = checkpoint::load(&dir).unwrap_err();
    assert!(err.to_string().contains("not a checkpoint written by Blink"), "{err}");

    fs::write(&path, b"not safetensors at all, just some text").unwrap();
    assert!(matches!(checkpoint::load(&dir).unwrap_err(), CheckpointError::Malformed { .. }));
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn resume_refuses_another_runs_checkpoint() {
    let dir = scratch("fingerprint");
    let s = state(15, 1, 2, 3);
    checkpoint::save(&dir, &s).unwrap();
    assert_eq!(checkpoint::resume(&dir, &s.fingerprint).unwrap().unwrap(), s);
    let err = checkpoint::resume(&dir, "sha256:other").unwrap_err();
    assert!(matches!(err, CheckpointError::Fingerprint { .. }), "{err:?}");
    assert!(err.to_string().contains("different run"), "{err}");
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn an_inconsistent_state_is_not_saved() {
    let dir = scratch("invalid");
    let good = state(17, 1, 2, 3);
    checkpoint::save(&dir, &good).unwrap();
    let mut bad = good.clone();
    bad.params.layers[0][0].as_mut().unwrap().b.pop();
    assert!(matches!(checkpoint::save(&dir, &bad).unwrap_err(), CheckpointError::InvalidState { .. }));
    let mut bad = good.clone();
    bad.adam_v.pop();
    assert!(matches!(checkpoint::save(&dir, &bad).unwrap_err(), CheckpointError::InvalidState { .. }));
    assert_eq!(checkpoint::load(&dir).unwrap().unwrap(), good);
    assert_eq!(listing(&dir), [FILE_NAME]);
    fs::remove_dir_all(&dir).unwrap();
}

/// A tmpfs of a given size, unmounted (and its mount point removed) when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(name: &str, size: &str) -> Tmpfs {
        let dir = scratch(name);
        let out = Command::new("mount").args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"]).arg(&dir).output().expect("cannot run mount");
        assert!(out.status.success(), "mounting a {size} tmpfs on {} failed: {}", dir.display(), String::from_utf8_lossy(&out.stderr));
        Tmpfs(dir)
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let ok = Command::new("umount").arg(&self.0).status().is_ok_and(|s| s.success());
        if ok {
            let _ = fs::remove_dir(&self.0);
        } else {
            eprintln!("could not unmount {}", self.0.display());
        }
    }
}

fn running_as_root() -> bool {
    let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
    status.lines().any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"))
}

#[test]
fn a_full_disk_is_an_error_and_keeps_the_last_checkpoint() {
    if !running_as_root() {
        eprintln!("NOT RUN: a_full_disk_is_an_error_and_keeps_the_last_checkpoint mounts a tmpfs and needs root");
        return;
    }
    let fs = Tmpfs::mount("full-disk", "256k");
    let small = state(19, 2, 4, 100); // ~12 KB
    checkpoint::save(&fs.0, &small).unwrap();
    let big = state(20, 4, 8, 8_000); // ~1.3 MB: cannot fit
    let err = checkpoint::save(&fs.0, &big).unwrap_err();
    assert!(matches!(err, CheckpointError::NoSpace { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("no space left on device") && msg.contains("the last checkpoint is kept"), "{msg}");
    let back = checkpoint::load(&fs.0).unwrap().expect("the first checkpoint");
    assert_eq!(back, small);
    assert_same_bits(&back, &small);
    assert_eq!(listing(&fs.0), [FILE_NAME], "no temporary file remains");
    // Once there is room again, saving works.
    checkpoint::save(&fs.0, &state(21, 2, 4, 200)).unwrap();
    assert_eq!(listing(&fs.0), [FILE_NAME]);
}
