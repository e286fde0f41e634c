//! Uploaded files (`POST /v1/files`), each a chat fine-tuning JSONL checked at upload (every
//! bad line named), kept as `files/<id>.jsonl` with its record beside it in
//! `files/<id>.json`. A file exists once its record is written, after its content (both
//! atomically), so a crash mid-upload leaves no file behind; a delete removes the record
//! first. Opening the store sweeps what an interrupted upload or delete left.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde_json::{json, Value};

use super::{new_id, unix_now, StoreError};
use crate::data::parse_jsonl;
use crate::durable;

/// The only purpose this server accepts: training data for a fine-tuning job.
pub const PURPOSE_FINE_TUNE: &str = "fine-tune";
const TEMP_PREFIX: &str = ".upload.tmp-";

/// What the store knows of a file: OpenAI's file object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileRecord {
    pub id: String,
    pub bytes: u64,
    pub created_at: u64,
    pub filename: String,
    pub purpose: String,
}

impl FileRecord {
    /// OpenAI's JSON shape of a file object.
    pub fn to_json(&self) -> Value {
        json!({
            "id": self.id, "object": "file", "bytes": self.bytes, "created_at": self.created_at,
            "filename": self.filename, "purpose": self.purpose, "status": "processed", "status_details": null,
        })
    }

    fn from_json(v: &Value) -> Option<FileRecord> {
        Some(FileRecord {
            id: v["id"].as_str()?.to_string(),
            bytes: v["bytes"].as_u64()?,
            created_at: v["created_at"].as_u64()?,
            filename: v["filename"].as_str()?.to_string(),
            purpose: v["purpose"].as_str()?.to_string(),
        })
    }
}

/// The files of a state directory.
pub struct FileStore {
    dir: PathBuf,
    records: Mutex<BTreeMap<String, FileRecord>>,
}

impl FileStore {
    /// Opens (creating) `state_dir/files`, reading every committed record.
    pub fn open(state_dir: &Path) -> Result<FileStore, StoreError> {
        let dir = state_dir.join("files");
        fs::create_dir_all(&dir).map_err(|e| StoreError::io(&dir, "cannot create", e))?;
        durable::remove_stray_temps(&dir, TEMP_PREFIX);
        let mut records = BTreeMap::new();
        let mut contents = Vec::new();
        for entry in fs::read_dir(&dir).map_err(|e| StoreError::io(&dir, "cannot list", e))?.flatten() {
            let path = entry.path();
            match path.extension().and_then(|e| e.to_str()) {
                Some("json") => {
                    let record = fs::read(&path).ok().and_then(|b| serde_json::from_slice::<Value>(&b).ok()).and_then(|v| FileRecord::from_json(&v));
                    match record {
                        Some(r) if dir.join(format!("{}.jsonl", r.id)).is_file() => {
                            records.insert(r.id.clone(), r);
                        }
                        // Written whole or not at all, so unreadable means not ours: leave it.
                        _ => {}
                    }
                }
                Some("jsonl") => contents.push(path),
                _ => {}
            }
        }
        // Content without a record: an upload that never committed, or a delete cut short.
        for path in contents {
            let id = path.file_stem().and_then(|s| s.to_str()).unwrap_or_default();
            if !records.contains_key(id) {
                let _ = fs::remove_file(&path);
            }
        }
        Ok(FileStore { dir, records: Mutex::new(records) })
    }

    /// Checks `content` as fine-tuning data and stores it; the error names every bad line.
    pub fn create(&self, filename: &str, purpose: &str, content: &[u8]) -> Result<FileRecord, StoreError> {
        if purpose != PURPOSE_FINE_TUNE {
            return Err(StoreError::Invalid(format!("purpose '{purpose}' is not supported; this server accepts '{PURPOSE_FINE_TUNE}'")));
        }
        parse_jsonl(content).map_err(StoreError::BadData)?;
        let filename = filename.rsplit(['/', '\\']).next().unwrap_or_default();
        let filename = if filename.is_empty() { "upload.jsonl" } else { filename };
        let mut records = self.lock();
        let id = loop {
            let id = new_id("file-");
            if !records.contains_key(&id) {
                break id;
            }
        };
        let record = FileRecord { id: id.clone(), bytes: content.len() as u64, created_at: unix_now(), filename: filename.to_string(), purpose: purpose.to_string() };
        let data_path = self.content_path(&id);
        write(&self.dir, &data_path, content)?;
        let meta = serde_json::to_vec(&record.to_json()).expect("a JSON value serializes");
        if let Err(e) = write(&self.dir, &self.record_path(&id), &meta) {
            let _ = fs::remove_file(&data_path);
            return Err(e);
        }
        records.insert(id, record.clone());
        Ok(record)
    }

    /// Every file, newest first (as OpenAI lists them).
    pub fn list(&self) -> Vec<FileRecord> {
        let mut all: Vec<FileRecord> = self.lock().values().cloned().collect();
        all.sort_by(|a, b| b.created_at.cmp(&a.created_at).then_with(|| b.id.cmp(&a.id)));
        all
    }

    pub fn get(&self, id: &str) -> Result<FileRecord, StoreError> {
        self.lock().get(id).cloned().ok_or_else(|| StoreError::NotFound { what: "file", id: id.to_string() })
    }

    /// The file's content, as uploaded.
    pub fn content(&self, id: &str) -> Result<Vec<u8>, StoreError> {
        let path = self.path(id)?;
        fs::read(&path).map_err(|e| StoreError::io(&path, "cannot read", e))
    }

    /// Where the file's content is (for a job to read).
    pub fn path(&self, id: &str) -> Result<PathBuf, StoreError> {
        self.get(id).map(|r| self.content_path(&r.id))
    }

    /// Removes the file: its record first, so a crash midway leaves no file.
    pub fn delete(&self, id: &str) -> Result<(), StoreError> {
        let mut records = self.lock();
        if !records.contains_key(id) {
            return Err(StoreError::NotFound { what: "file", id: id.to_string() });
        }
        let record = self.record_path(id);
        fs::remove_file(&record).map_err(|e| StoreError::io(&record, "cannot remove", e))?;
        records.remove(id);
        let _ = durable::sync_dir(&self.dir);
        let _ = fs::remove_file(self.content_path(id));
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, FileRecord>> {
        // A panic while holding the lock leaves the map as consistent as the disk: go on.
        self.records.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn content_path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.jsonl"))
    }

    fn record_path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }
}

fn write(dir: &Path, path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    use std::io::Write;
    durable::replace(dir, path, TEMP_PREFIX, |f| f.write_all(bytes)).map_err(|e| StoreError::io(path, e.action, e.source))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"hello\"}]}\n";

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("blink-store-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn files_survive_a_reopen_and_deletes_stick() {
        let dir = scratch("reopen");
        let store = FileStore::open(&dir).unwrap();
        let a = store.create("dir/train.jsonl", PURPOSE_FINE_TUNE, GOOD.as_bytes()).unwrap();
        let b = store.create("", PURPOSE_FINE_TUNE, GOOD.as_bytes()).unwrap();
        assert_ne!(a.id, b.id);
        assert_eq!((a.filename.as_str(), b.filename.as_str(), a.bytes), ("train.jsonl", "upload.jsonl", GOOD.len() as u64));
        store.delete(&b.id).unwrap();
        drop(store);
        let store = FileStore::open(&dir).unwrap();
        assert_eq!(store.list(), vec![a.clone()]);
        assert_eq!(store.content(&a.id).unwrap(), GOOD.as_bytes());
        assert!(matches!(store.get(&b.id), Err(StoreError::NotFound { .. })));
        assert!(matches!(store.delete(&b.id), Err(StoreError::NotFound { .. })));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn bad_data_and_purposes_are_refused_and_nothing_is_kept() {
        let dir = scratch("bad");
        let store = FileStore::open(&dir).unwrap();
        let bad = format!("{GOOD}{{\"messages\": 3}}\n{GOOD}not json\n");
        match store.create("t.jsonl", PURPOSE_FINE_TUNE, bad.as_bytes()) {
            Err(StoreError::BadData(e)) => {
                let msg = e.to_string();
                assert!(msg.contains("line 2") && msg.contains("line 4") && !msg.contains("line 1:"), "{msg}");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(store.create("t.jsonl", "assistants", GOOD.as_bytes()), Err(StoreError::Invalid(_))));
        assert!(store.list().is_empty());
        assert_eq!(fs::read_dir(dir.join("files")).unwrap().count(), 0, "a refused upload left files");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn leftovers_of_interrupted_uploads_are_swept() {
        let dir = scratch("sweep");
        let store = FileStore::open(&dir).unwrap();
        let kept = store.create("t.jsonl", PURPOSE_FINE_TUNE, GOOD.as_bytes()).unwrap();
        drop(store);
        let files = dir.join("files");
        // A temporary file of a write cut short, and content whose record was never written.
        fs::write(files.join(format!("{TEMP_PREFIX}1-2-3")), b"partial").unwrap();
        fs::write(files.join("file-000000000000000000000000.jsonl"), GOOD).unwrap();
        let store = FileStore::open(&dir).unwrap();
        assert_eq!(store.list(), vec![kept.clone()]);
        let mut names: Vec<String> = fs::read_dir(&files).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        names.sort();
        assert_eq!(names, vec![format!("{}.json", kept.id), format!("{}.jsonl", kept.id)]);
        fs::remove_dir_all(&dir).unwrap();
    }
}
