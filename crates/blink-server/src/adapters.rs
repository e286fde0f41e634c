//! The server's LoRA adapters: their names (vLLM's `model: "<name>"`) and llama.cpp's
//! numeric ids and default scales, the set held in memory (at most `--max-cpu-loras`; past
//! it the least recently used idle adapter is evicted, and read again when asked for),
//! run-time paths confined to `--lora-dir`, what a request's `model` and `lora` fields
//! resolve to, and the adapters fine-tuning jobs publish (registered by name and path, read
//! on first use: `AdapterSink`).
//!
//! A request holds its adapters through an `Arc`, so one in flight when its adapter is
//! unloaded, replaced or evicted finishes on the weights it started with; the memory goes
//! when the last such request ends. Reading an adapter runs on a blocking thread, never on
//! the engine's.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use blink_model::lora::{LoraAdapter, LoraError, LoraMix};
use blink_model::Model;
use blink_train::jobs::AdapterSink;

use crate::error::ApiError;

/// How the server holds adapters.
#[derive(Clone, Debug, Default)]
pub struct AdapterOptions {
    /// Adapters loaded at start: name, path and default scale (llama.cpp's global scale,
    /// applied to requests that name no adapter; 0 for vLLM-style named adapters).
    pub preload: Vec<(String, PathBuf, f32)>,
    /// The only directory run-time loads may read from (`None`: no run-time loading).
    pub dir: Option<PathBuf>,
    /// Most adapters held in memory (`None`: no limit).
    pub max_resident: Option<usize>,
}

/// What `/v1/models`, `/lora-adapters` and `/metrics` show of one adapter.
#[derive(Clone, Debug)]
pub struct AdapterInfo {
    pub id: u64,
    pub name: String,
    pub path: PathBuf,
    pub scale: f32,
    pub rank: usize,
    pub alpha: f32,
    /// Held in memory now (evicted ones are read again on demand).
    pub resident: bool,
    /// Unix time it was loaded.
    pub created: u64,
}

/// Memory and counts for `/metrics`.
#[derive(Clone, Copy, Debug, Default)]
pub struct AdapterStats {
    pub registered: usize,
    pub resident: usize,
    /// Bytes the resident adapters hold (every part's copy).
    pub held_bytes: usize,
    /// Bytes of the resident adapters' tensors as f32, once each.
    pub tensor_bytes: usize,
    pub loads_total: u64,
    pub evictions_total: u64,
}

struct Entry {
    info: AdapterInfo,
    weights: Option<Arc<LoraAdapter>>,
    /// Logical time of its last use, for eviction.
    last_used: u64,
}

#[derive(Default)]
struct Registry {
    entries: Vec<Entry>,
    next_id: u64,
    clock: u64,
    loads: u64,
    evictions: u64,
}

/// Every adapter the server knows.
pub struct Adapters {
    model: Arc<Model>,
    /// The base model's names, which no adapter may take.
    reserved: Vec<String>,
    dir: Option<PathBuf>,
    max_resident: usize,
    registry: Mutex<Registry>,
}

impl Adapters {
    /// Load the adapters given at start (blocking). A bad one stops the server starting.
    pub fn start(model: Arc<Model>, opts: &AdapterOptions, reserved: &[String]) -> Result<Adapters, String> {
        let dir = match &opts.dir {
            Some(d) => Some(std::fs::canonicalize(d).map_err(|e| format!("--lora-dir {}: {e}", d.display()))?),
            None => None,
        };
        if opts.max_resident == Some(0) {
            return Err("--max-cpu-loras must be at least 1".into());
        }
        let adapters = Adapters { model, reserved: reserved.to_vec(), dir, max_resident: opts.max_resident.unwrap_or(usize::MAX), registry: Mutex::default() };
        for (name, path, scale) in &opts.preload {
            check_name(name, reserved).map_err(|e| format!("--lora {name}: {}", e.message))?;
            if !scale.is_finite() {
                return Err(format!("--lora {name}: the scale must be finite, not {scale}"));
            }
            let weights = adapters.model.load_lora(path).map_err(|e| format!("--lora {}", e.about(path)))?;
            let mut reg = adapters.lock();
            if reg.entries.iter().any(|e| &e.info.name == name) {
                return Err(format!("--lora {name}: the name is given twice"));
            }
            if reg.entries.len() >= adapters.max_resident {
                return Err(format!("--lora: more adapters than --max-cpu-loras ({})", adapters.max_resident));
            }
            reg.insert(name.clone(), path.clone(), *scale, weights);
        }
        Ok(adapters)
    }

    fn lock(&self) -> MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// vLLM's `load_lora_adapter`: read the adapter at `path` (inside `--lora-dir`) and
    /// serve it as `name`; an existing `name` is replaced only with `inplace`.
    pub async fn load(self: &Arc<Self>, name: &str, path: &str, inplace: bool, reserved: &[String]) -> Result<AdapterInfo, ApiError> {
        check_name(name, reserved)?;
        let path = self.confine(path)?;
        if !inplace && self.lock().find(name).is_some() {
            return Err(ApiError::param("lora_name", format!("the adapter '{name}' is already loaded; pass load_inplace to replace it")));
        }
        let weights = self.read(path.clone()).await?;
        let mut reg = self.lock();
        if let Some(i) = reg.find(name) {
            if !inplace {
                return Err(ApiError::param("lora_name", format!("the adapter '{name}' is already loaded; pass load_inplace to replace it")));
            }
            // Requests in flight keep the old weights through their Arc. The adapter keeps
            // its id, place and scale, so llama.cpp-style `lora` lists still name it.
            if reg.entries[i].weights.is_none() {
                reg.make_room(self.max_resident)?;
            }
            return Ok(reg.replace(i, path, weights));
        }
        reg.make_room(self.max_resident)?;
        Ok(reg.insert(name.to_owned(), path, 0.0, weights))
    }

    /// vLLM's `unload_lora_adapter`.
    pub fn unload(&self, name: &str) -> Result<(), ApiError> {
        let removed = {
            let mut reg = self.lock();
            let i = reg.find(name).ok_or_else(|| ApiError::adapter_not_found(name))?;
            reg.entries.remove(i)
        };
        drop(removed);
        release_free_memory();
        Ok(())
    }

    /// Every adapter, in load order.
    pub fn list(&self) -> Vec<AdapterInfo> {
        let mut reg = self.lock();
        for e in &mut reg.entries {
            e.info.resident = e.weights.is_some();
        }
        reg.entries.iter().map(|e| e.info.clone()).collect()
    }

    /// Whether `name` is a served adapter.
    pub fn contains(&self, name: &str) -> bool {
        self.lock().find(name).is_some()
    }

    /// llama.cpp's `POST /lora-adapters`: the default scales; adapters left out get 0.
    pub fn set_scales(&self, scales: &[(u64, f32)]) -> Result<(), ApiError> {
        let mut reg = self.lock();
        check_ids(&reg, scales)?;
        for e in &mut reg.entries {
            e.info.scale = scales.iter().rev().find(|(id, _)| *id == e.info.id).map_or(0.0, |&(_, s)| s);
        }
        Ok(())
    }

    /// The adapters a request runs with: `name` (a served adapter's name, at scale 1), or the
    /// request's `lora` list (llama.cpp's ids and scales), or else the default scales.
    /// `None` is the base model.
    pub async fn resolve(self: &Arc<Self>, name: Option<&str>, lora: Option<&[(u64, f32)]>) -> Result<Option<Arc<LoraMix>>, ApiError> {
        let wanted: Vec<(u64, f32)> = {
            let reg = self.lock();
            let named = match name {
                Some(n) => Some(reg.find(n).ok_or_else(|| ApiError::model_not_found(n, "the base model"))?),
                None => None,
            };
            match (named, lora) {
                (Some(_), Some(_)) => {
                    return Err(ApiError::param("lora", "a request names an adapter by `model` or lists adapters in `lora`, not both"));
                }
                (Some(i), None) => vec![(reg.entries[i].info.id, 1.0)],
                (None, Some(list)) => {
                    check_ids(&reg, list)?;
                    list.to_vec()
                }
                (None, None) => reg.entries.iter().map(|e| (e.info.id, e.info.scale)).collect(),
            }
        };
        let mut mix = Vec::new();
        for (id, scale) in wanted.into_iter().filter(|&(_, s)| s != 0.0) {
            mix.push((self.weights(id).await?, scale));
        }
        Ok((!mix.is_empty()).then(|| Arc::new(LoraMix::new(mix))))
    }

    /// The weights of adapter `id`, read again if they were evicted.
    async fn weights(self: &Arc<Self>, id: u64) -> Result<Arc<LoraAdapter>, ApiError> {
        let path = {
            let mut reg = self.lock();
            let i = reg.by_id(id).ok_or_else(|| ApiError::param("lora", format!("the adapter id {id} was unloaded")))?;
            reg.clock += 1;
            let now = reg.clock;
            let e = &mut reg.entries[i];
            e.last_used = now;
            if let Some(w) = &e.weights {
                return Ok(w.clone());
            }
            e.info.path.clone()
        };
        let weights = Arc::new(self.read(path).await?);
        let mut reg = self.lock();
        let i = reg.by_id(id).ok_or_else(|| ApiError::param("lora", format!("the adapter id {id} was unloaded")))?;
        if let Some(w) = &reg.entries[i].weights {
            // Another request read it meanwhile.
            return Ok(w.clone());
        }
        reg.make_room(self.max_resident)?;
        reg.loads += 1;
        let e = &mut reg.entries[i];
        (e.info.rank, e.info.alpha) = (weights.max_rank(), weights.alpha());
        e.weights = Some(weights.clone());
        Ok(weights)
    }

    /// Serve the adapter at `path` as `name` from now on, read when a request first asks for
    /// it (so it counts against `--max-cpu-loras` only then). A name already served is
    /// pointed at `path`, its weights read again on next use; requests in flight keep theirs.
    pub fn register(&self, name: &str, path: &Path) -> Result<AdapterInfo, String> {
        check_name(name, &self.reserved).map_err(|e| e.message)?;
        if !path.join("adapter_config.json").is_file() && !path.is_file() {
            return Err(format!("no adapter at {}", path.display()));
        }
        let (rank, alpha) = peft_rank_alpha(path);
        let created = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let mut reg = self.lock();
        let i = match reg.find(name) {
            Some(i) => i,
            None => {
                let id = reg.next_id;
                reg.next_id += 1;
                let info = AdapterInfo { id, name: name.to_owned(), path: PathBuf::new(), scale: 0.0, rank: 0, alpha: 0.0, resident: false, created: 0 };
                reg.entries.push(Entry { info, weights: None, last_used: 0 });
                reg.entries.len() - 1
            }
        };
        let e = &mut reg.entries[i];
        e.info.path = path.to_path_buf();
        (e.info.rank, e.info.alpha, e.info.created) = (rank, alpha, created);
        e.weights = None;
        Ok(e.info.clone())
    }

    /// Read and place an adapter on a blocking thread.
    async fn read(&self, path: PathBuf) -> Result<LoraAdapter, ApiError> {
        let model = self.model.clone();
        let given = path.clone();
        let result = tokio::task::spawn_blocking(move || model.load_lora(&path)).await;
        let shown = given.display();
        match result {
            Ok(Ok(w)) => Ok(w),
            Ok(Err(LoraError::Memory(e))) => Err(ApiError::busy(format!("the adapter {shown} does not fit in memory: {e}"))),
            Ok(Err(e)) => Err(ApiError::param("lora_path", e.about(&given))),
            Err(e) => Err(ApiError::internal(format!("reading the adapter {shown} failed: {e}"))),
        }
    }

    /// `path` (relative to `--lora-dir`, or absolute) resolved, links followed, and checked
    /// to lie inside `--lora-dir`.
    fn confine(&self, path: &str) -> Result<PathBuf, ApiError> {
        let Some(dir) = &self.dir else {
            return Err(ApiError::forbidden("run-time adapter loading is off; start the server with --lora-dir DIR to allow loads from DIR"));
        };
        if path.is_empty() {
            return Err(ApiError::param("lora_path", "lora_path is empty"));
        }
        // Refused before the file system is asked, so a request cannot learn what exists
        // outside the directory.
        let asked = Path::new(path);
        let escapes = asked.components().any(|c| matches!(c, std::path::Component::ParentDir));
        if escapes || (asked.is_absolute() && !asked.starts_with(dir)) {
            return Err(ApiError::forbidden(format!("{path} is outside --lora-dir; adapters load only from {}", dir.display())));
        }
        let joined = dir.join(path);
        let real = std::fs::canonicalize(&joined).map_err(|e| ApiError::param("lora_path", format!("no adapter at {path}: {e}")))?;
        if !real.starts_with(dir) {
            return Err(ApiError::forbidden(format!("{path} is outside --lora-dir; adapters load only from {}", dir.display())));
        }
        Ok(real)
    }

    /// Counts and memory for `/metrics`.
    pub fn stats(&self) -> AdapterStats {
        let reg = self.lock();
        let resident: Vec<&Arc<LoraAdapter>> = reg.entries.iter().filter_map(|e| e.weights.as_ref()).collect();
        AdapterStats {
            registered: reg.entries.len(),
            resident: resident.len(),
            held_bytes: resident.iter().map(|w| w.held_bytes()).sum(),
            tensor_bytes: resident.iter().map(|w| w.tensor_bytes()).sum(),
            loads_total: reg.loads,
            evictions_total: reg.evictions,
        }
    }
}

impl Registry {
    fn find(&self, name: &str) -> Option<usize> {
        self.entries.iter().position(|e| e.info.name == name)
    }

    fn by_id(&self, id: u64) -> Option<usize> {
        self.entries.iter().position(|e| e.info.id == id)
    }

    fn insert(&mut self, name: String, path: PathBuf, scale: f32, weights: LoraAdapter) -> AdapterInfo {
        let info = AdapterInfo { id: self.next_id, name, path: path.clone(), scale, rank: 0, alpha: 0.0, resident: false, created: 0 };
        self.next_id += 1;
        self.entries.push(Entry { info, weights: None, last_used: 0 });
        self.replace(self.entries.len() - 1, path, weights)
    }

    /// Entry `i` now serves `weights`, read from `path` (its id, name and scale stay).
    fn replace(&mut self, i: usize, path: PathBuf, weights: LoraAdapter) -> AdapterInfo {
        self.clock += 1;
        self.loads += 1;
        let e = &mut self.entries[i];
        e.info.path = path;
        e.info.rank = weights.max_rank();
        e.info.alpha = weights.alpha();
        e.info.resident = true;
        e.info.created = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        e.weights = Some(Arc::new(weights));
        e.last_used = self.clock;
        e.info.clone()
    }

    /// Evict least recently used idle adapters (held by no request) until one more fits;
    /// 503 when every resident adapter is in use.
    fn make_room(&mut self, max_resident: usize) -> Result<(), ApiError> {
        while self.entries.iter().filter(|e| e.weights.is_some()).count() >= max_resident {
            let idle = self
                .entries
                .iter_mut()
                .filter(|e| e.weights.as_ref().is_some_and(|w| Arc::strong_count(w) == 1))
                .min_by_key(|e| e.last_used);
            let Some(victim) = idle else {
                return Err(ApiError::busy(format!("all {max_resident} adapters held in memory (--max-cpu-loras) are in use; retry")));
            };
            victim.weights = None;
            self.evictions += 1;
        }
        release_free_memory();
        Ok(())
    }
}

/// A fine-tuning job's adapter (or checkpoint) becomes a model requests may name.
impl AdapterSink for Adapters {
    fn publish(&self, name: &str, dir: &Path) -> Result<(), String> {
        self.register(name, dir).map(|_| ())
    }
}

/// The rank and alpha a PEFT directory's `adapter_config.json` states (zeros when it
/// cannot be read; loading the adapter fills them in).
fn peft_rank_alpha(dir: &Path) -> (usize, f32) {
    let config = std::fs::read(dir.join("adapter_config.json")).ok().and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok());
    let Some(c) = config else { return (0, 0.0) };
    (c["r"].as_u64().map_or(0, |r| r as usize), c["lora_alpha"].as_f64().map_or(0.0, |a| a as f32))
}

/// A name must be non-empty, printable, and not one of the base model's names.
fn check_name(name: &str, reserved: &[String]) -> Result<(), ApiError> {
    if name.is_empty() || name.len() > 256 || name.chars().any(char::is_control) {
        return Err(ApiError::param("lora_name", "lora_name must be 1 to 256 printable characters"));
    }
    if reserved.iter().any(|r| r == name) {
        return Err(ApiError::param("lora_name", format!("'{name}' is the base model's name")));
    }
    Ok(())
}

/// 400 unless every id is a served adapter's and every scale is finite.
fn check_ids(reg: &Registry, list: &[(u64, f32)]) -> Result<(), ApiError> {
    for &(id, scale) in list {
        if reg.by_id(id).is_none() {
            let ids: Vec<u64> = reg.entries.iter().map(|e| e.info.id).collect();
            return Err(ApiError::param("lora", format!("invalid adapter id {id}; the served ids are {ids:?}")));
        }
        if !scale.is_finite() {
            return Err(ApiError::param("lora", format!("the scale of adapter {id} must be finite")));
        }
    }
    Ok(())
}

/// Give freed heap pages back to the OS (an adapter's many small matrices come from the
/// heap, whose free pages glibc keeps until asked).
fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The name a startup `--lora` without `NAME=` gets: its file or directory name.
pub fn default_name(path: &Path) -> String {
    let stem = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    stem.strip_suffix(".gguf").map(str::to_owned).unwrap_or(stem)
}
