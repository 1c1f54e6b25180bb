//! The contract between the HTTP layer of `attn serve` and the engine that translates: what a
//! request becomes (a [`Job`] of sentences for one language pair) and what comes back. The HTTP
//! layer knows nothing of models; the engine nothing of HTTP.

use candle_attention::TranslateError;
use std::time::Instant;
use tokio::sync::oneshot;

/// One language as LibreTranslate's API names it (`GET /languages`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ApiLanguage {
    /// LibreTranslate's code: ISO 639-1 (`en`), or its own for scripts and variants
    /// (`zh-Hans`, `zh-Hant`, `pt-BR`).
    pub code: String,
    /// The English name (`English`).
    pub name: String,
    /// The codes it translates into.
    pub targets: Vec<String>,
}

/// A request's sentences for one language pair, codes already checked against
/// [`Backend::languages`].
#[derive(Clone, Debug)]
pub struct Job {
    /// The source language's API code (never `auto`: the HTTP layer detects it first).
    pub source: String,
    /// The target language's API code.
    pub target: String,
    /// The sentences, already split; an empty one is answered with an empty translation.
    pub sentences: Vec<String>,
    /// Extra hypotheses wanted per sentence besides the best (0: none).
    pub alternatives: usize,
    /// Past it, the job's rows leave the batch and it is answered [`JobError::TimedOut`].
    pub deadline: Instant,
}

/// One translated sentence.
#[derive(Clone, Debug, PartialEq)]
pub struct Sentence {
    /// The best translation.
    pub text: String,
    /// The next best ones (the best excluded), as many as the job asked for where the beam has
    /// them.
    pub alternatives: Vec<String>,
}

/// Why a whole job got no answer.
#[derive(Clone, Debug)]
pub enum JobError {
    /// Its deadline passed first.
    TimedOut,
    /// The engine stopped (shutting down) before it was done.
    Stopped,
}

/// Why a job was not taken.
#[derive(Clone, Debug)]
pub enum SubmitError {
    /// The queue is full: try again after this many seconds (429 with `Retry-After`).
    Overloaded {
        /// The `Retry-After` to send.
        retry_after_secs: u64,
    },
    /// The pair is not served (400, e.g. "xx is not supported").
    Unsupported(String),
}

/// What a job's receiver gets: one result per sentence, in order, or an error for the job.
pub type JobResult = Result<Vec<Result<Sentence, TranslateError>>, JobError>;

/// The engine's gauges and counters, for `/metrics`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Sentences waiting for a place in the running batch.
    pub queued_sentences: usize,
    /// Decoder rows (sentences × beams) in the running batch.
    pub running_rows: usize,
    /// Tokens generated since start.
    pub tokens_generated: u64,
}

/// What the HTTP layer needs from an engine.
pub trait Backend: Send + Sync + 'static {
    /// The languages served, each with its targets.
    fn languages(&self) -> Vec<ApiLanguage>;
    /// The beam width the models search with (`alternatives` can be at most `beam - 1`).
    fn beam(&self) -> usize;
    /// Queues a job: the receiver gets one result per sentence, in order, once all are done.
    /// Dropping the receiver cancels the job (its rows leave the batch).
    fn submit(&self, job: Job) -> Result<oneshot::Receiver<JobResult>, SubmitError>;
    /// Gauges and counters.
    fn stats(&self) -> Stats;
}
