//! The admission policy seam: which waiting requests join the running batch, and how many
//! prompt tokens a step may take. First come, first served is the first policy; an
//! SLO-aware policy (a latency model's prediction against each request's targets) and
//! the co-serving hook (training work in the step's slack) plug in here.

/// A waiting request, as the policy sees it.
#[derive(Clone, Copy, Debug)]
pub struct Candidate {
    pub prompt_tokens: usize,
    pub max_tokens: usize,
    /// A prompt still being computed shares at least a block of this one's uncached
    /// tokens: admitted once that prompt is published, it attaches them instead.
    pub shares_a_prefill: bool,
}

/// The engine's load when a decision is made.
#[derive(Clone, Copy, Debug)]
pub struct Load {
    pub running: usize,
    pub max_running: usize,
    /// Decode rows the coming step has at most.
    pub decoding: usize,
    /// The step's token budget (`--step-tokens`).
    pub step_tokens: usize,
}

/// What to do with a candidate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Reserve its KV need and run it.
    Admit,
    /// Leave it waiting and look at the next one.
    Skip,
    /// Admit no more this step.
    Stop,
}

/// Decides admissions and the prompt budget of each step.
pub trait AdmissionPolicy: Send {
    /// Whether to admit `c` now (the engine has a free slot).
    fn consider(&mut self, c: &Candidate, load: &Load) -> Verdict;
    /// `c` was to be admitted but its KV need cannot be reserved now.
    fn no_room(&mut self, c: &Candidate) -> Verdict;
    /// Prompt tokens the coming step may take.
    fn prompt_budget(&self, load: &Load) -> usize;
}

/// First come, first served: requests are admitted in order while their KV need fits, a
/// request that waits for a shared prefill is passed by the ones behind it, and decode
/// rows take the step budget first but prompts always get a quarter of it (so a new
/// request moves on while more sequences decode than a step holds tokens).
#[derive(Clone, Copy, Debug, Default)]
pub struct FirstComeFirstServed;

impl AdmissionPolicy for FirstComeFirstServed {
    fn consider(&mut self, c: &Candidate, _: &Load) -> Verdict {
        if c.shares_a_prefill {
            Verdict::Skip
        } else {
            Verdict::Admit
        }
    }

    fn no_room(&mut self, _: &Candidate) -> Verdict {
        Verdict::Stop
    }

    fn prompt_budget(&self, load: &Load) -> usize {
        let floor = load.step_tokens.div_ceil(4);
        load.step_tokens.saturating_sub(load.decoding).max(floor)
    }
}
