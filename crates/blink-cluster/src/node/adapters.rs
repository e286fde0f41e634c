//! The LoRA adapters a node holds for its head: their pairs on the node's layers arrive
//! layer by layer, are placed on the node's model when the head says so, and are let go
//! when the head drops them. Steps name them by the head's numbers in their mixes.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use blink_model::lora::{LoraAdapter, LoraFormat, LoraMix, LoraPair, LoraTensors};
use blink_model::Model;

use crate::wire::{AdapterLayer, MixPart};

#[derive(Default)]
pub struct NodeAdapters {
    placed: HashMap<u64, Arc<LoraAdapter>>,
    /// Layers received of adapters not yet placed (one entry per model layer).
    pending: HashMap<u64, Vec<[Option<LoraPair>; 7]>>,
    /// The latest steps' mixes, as sent and as built, newest first: the steps of one
    /// batch of requests carry the same ones, and several batches in flight take turns,
    /// so each is built once.
    recent: VecDeque<BuiltMixes>,
}

/// A step's mixes as sent, and as built from the adapters placed here.
type BuiltMixes = (Vec<Vec<MixPart>>, Vec<Arc<LoraMix>>);

/// How many steps' mixes a node keeps built (more than steps are ever in flight).
const RECENT: usize = 8;

impl NodeAdapters {
    /// Keep an adapter's pairs on one layer until it is placed.
    pub fn receive(&mut self, model: &Model, layer: AdapterLayer) -> Result<(), String> {
        let n_layers = model.cfg.n_layers;
        let l = layer.layer as usize;
        if l >= n_layers {
            return Err(format!("adapter {}: a layer {l} of a model of {n_layers}", layer.adapter));
        }
        let layers = self.pending.entry(layer.adapter).or_insert_with(|| vec![Default::default(); n_layers]);
        layers[l] = layer.pairs;
        Ok(())
    }

    /// Place adapter `id` from the layers received (none: it changes no layer here).
    pub fn place(&mut self, model: &Model, id: u64, alpha: f32, rslora: bool) -> Result<(), String> {
        let layers = self.pending.remove(&id).unwrap_or_else(|| vec![Default::default(); model.cfg.n_layers]);
        let tensors = LoraTensors { format: LoraFormat::Peft, alpha, rslora, layers };
        let placed = model.place_lora(&tensors).map_err(|e| format!("adapter {id}: {e}"))?;
        self.placed.insert(id, Arc::new(placed));
        Ok(())
    }

    pub fn drop(&mut self, id: u64) {
        self.placed.remove(&id);
        self.pending.remove(&id);
        // The mixes built of it go with it.
        self.recent.retain(|(sent, _)| !sent.iter().flatten().any(|p| p.adapter == id));
    }

    /// The mixes a step names, built from the adapters placed here.
    pub fn mixes(&mut self, mixes: &[Vec<MixPart>]) -> Result<&[Arc<LoraMix>], String> {
        let at = match self.recent.iter().position(|(sent, _)| sent == mixes) {
            Some(at) => at,
            None => {
                let built = mixes
                    .iter()
                    .map(|mix| {
                        let parts = mix.iter().map(|p| match self.placed.get(&p.adapter) {
                            Some(a) if p.scale.is_finite() => Ok((a.clone(), p.scale)),
                            Some(_) => Err(format!("adapter {} at scale {}", p.adapter, p.scale)),
                            None => Err(format!("a step with adapter {}, which this node was not sent", p.adapter)),
                        });
                        Ok(Arc::new(LoraMix::new(parts.collect::<Result<Vec<_>, String>>()?)))
                    })
                    .collect::<Result<Vec<_>, String>>()?;
                self.recent.truncate(RECENT - 1);
                self.recent.push_front((mixes.to_vec(), built));
                0
            }
        };
        Ok(&self.recent[at].1)
    }
}
