//! The engine behind `attn serve`: the loaded models and one thread that decodes for all of
//! them with continuous batching ([`candle_attention::translator::Continuous`]).
//!
//! Requests arrive as [`Job`]s (a request's sentences for one language pair) through a bounded
//! inbox; the engine thread puts each sentence into its model's running batch, where it joins
//! the decode as soon as there is room, and answers a job as soon as its last sentence is done.
//! A job whose receiver is dropped (the client went away, the HTTP layer gave up) or whose
//! deadline passes has its sentences taken out of the batch at the next step. The decoding runs
//! on rayon's pool, never on the async runtime.

use super::backend::{
    ApiLanguage, Backend, Job, JobError, JobResult, Sentence, Stats, SubmitError,
};
use super::budget::{auto_budgets, bytes_per_token, MAX_AUTO_TOKENS};
use super::languages::{api_code, api_name};
use anyhow::Context;
use candle_attention::translator::Continuous;
use candle_attention::{Precision, TranslateError, TranslateOptions, Translator};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// One model to serve: a directory or hub id, and (for a one-pair model whose
/// `tokenizer_config.json` does not say it) its pair of API codes.
#[derive(Clone, Debug)]
pub struct ModelSpec {
    /// `en:de` given on the command line (`--model en:de=DIR`).
    pub pair: Option<(String, String)>,
    /// A directory or a hub id.
    pub model: PathBuf,
}

/// How the models are loaded and how the engine batches.
#[derive(Clone, Debug)]
pub struct EngineOptions {
    /// Beam width (default: LibreTranslate's 4).
    pub beam: Option<usize>,
    /// Most new tokens per sentence (default: the models').
    pub max_new_tokens: Option<usize>,
    /// f32, bf16, f16 or int8.
    pub precision: Precision,
    /// The most padded source tokens (sentences × longest, per cohort) of the sentences
    /// decoding at once in a model's running batch, all cohorts together; `None`: sized from
    /// the memory at rest after loading ([`super::budget`]).
    pub max_batch_tokens: Option<usize>,
    /// Decoder rows (sentences × beams) decoding at once, per model.
    pub max_batch_rows: usize,
    /// The most sentences waiting for a place in the running batch; beyond, jobs are refused.
    pub max_queue: usize,
    /// API codes to serve (all the models have, when empty).
    pub languages: Vec<String>,
}

/// Texts of the warm-up (see [`warm_up`]): enough source tokens for the encoder's products to
/// count as large ones.
const WARM_UP_TEXTS: usize = 24;

/// Runs two short batches through a model before the server says it is ready: what the first
/// busy seconds would do anyway (the weights multiplied by many rows are packed into panels,
/// the first buffers are touched) happens at load, so that the first requests are not slower
/// and the resident memory at rest is what the server works with (see docs/serving.md,
/// "Memory").
fn warm_up(translator: &Translator, route: &Route) -> anyhow::Result<()> {
    let text = "The committee will publish its annual report on the state of the national \
                parks, with figures for every region, early next year.";
    // Distinct texts: `translate_pair` decodes identical ones once.
    let texts: Vec<String> = (1..=WARM_UP_TEXTS)
        .map(|i| format!("{text} Part {i}."))
        .collect();
    let options = TranslateOptions {
        max_new_tokens: Some(4),
        ..TranslateOptions::default()
    };
    for _ in 0..2 {
        for result in translator.translate_pair(&texts, &route.source, &route.target, &options)? {
            result?;
        }
    }
    Ok(())
}

/// Where a pair of API codes is translated: the model and its codes for the two languages.
#[derive(Clone, Debug)]
struct Route {
    model: usize,
    source: String,
    target: String,
}

/// A job in progress.
struct Pending {
    reply: Option<oneshot::Sender<JobResult>>,
    results: Vec<Option<Result<Sentence, TranslateError>>>,
    left: usize,
    deadline: Instant,
    /// The tags of its sentences still decoding, with their model.
    tags: Vec<(usize, u64)>,
    alternatives: usize,
}

/// What the HTTP side and the engine thread share.
#[derive(Default)]
struct Shared {
    inbox: Mutex<Inbox>,
    wake: Condvar,
    queued: AtomicUsize,
    running_rows: AtomicUsize,
    tokens: AtomicU64,
    /// Sentences not yet answered: in the inbox, waiting in a batch or decoding.
    ahead: AtomicUsize,
    /// Sentences a second the engine finishes when its batches are full, in thousandths
    /// (0: not measured yet); see [`Capacity`].
    capacity_milli: AtomicU64,
}

/// The engine's measured capacity: sentences finished a second over windows of at least
/// [`Capacity::WINDOW`] during which work was waiting for room throughout (a window with room
/// to spare measures the clients, not the engine). Smoothed over windows.
struct Capacity {
    start: Instant,
    finished: usize,
    saturated: bool,
}

impl Capacity {
    const WINDOW: Duration = Duration::from_secs(2);

    fn new() -> Self {
        Self {
            start: Instant::now(),
            finished: 0,
            saturated: true,
        }
    }

    /// After a step that finished `finished` sentences, with `waiting` sentences still waiting
    /// for room.
    fn record(&mut self, shared: &Shared, finished: usize, waiting: usize) {
        self.finished += finished;
        self.saturated &= waiting > 0;
        let elapsed = self.start.elapsed();
        if elapsed < Self::WINDOW {
            return;
        }
        if self.saturated && self.finished > 0 {
            let rate = self.finished as f64 / elapsed.as_secs_f64();
            let old = shared.capacity_milli.load(Ordering::Relaxed) as f64 / 1000.0;
            let smoothed = if old > 0.0 {
                0.5 * old + 0.5 * rate
            } else {
                rate
            };
            shared.capacity_milli.store(
                (smoothed * 1000.0).round().max(1.0) as u64,
                Ordering::Relaxed,
            );
        }
        *self = Self::new();
    }
}

#[derive(Default)]
struct Inbox {
    jobs: VecDeque<(Job, Route, oneshot::Sender<JobResult>)>,
    stop: bool,
}

/// The loaded models and their decoding thread; implements [`Backend`].
pub struct Engine {
    shared: Arc<Shared>,
    routes: HashMap<(String, String), Route>,
    languages: Vec<ApiLanguage>,
    beam: usize,
    max_queue: usize,
    /// Each model's token budget, in `--model` order.
    budgets: Vec<usize>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Engine {
    /// Loads every model (each once) and starts the decoding thread. Errors name the model.
    pub fn load(models: Vec<ModelSpec>, options: EngineOptions) -> anyhow::Result<Engine> {
        if models.is_empty() {
            anyhow::bail!("no model to serve: give at least one --model")
        }
        if options.max_batch_tokens == Some(0) {
            anyhow::bail!(
                "--max-batch-tokens must be at least 1 (leave it out to size it from the memory at rest)"
            )
        }
        if options.max_batch_rows == 0 {
            anyhow::bail!("--max-batch-rows must be at least 1")
        }
        let mut translators = Vec::new();
        let mut routes: HashMap<(String, String), Route> = HashMap::new();
        let mut targets: BTreeMap<String, (String, Vec<String>)> = BTreeMap::new();
        let wanted = |code: &str| {
            options.languages.is_empty() || options.languages.iter().any(|l| l == code)
        };
        for (index, spec) in models.iter().enumerate() {
            let mut builder = Translator::builder(&spec.model)
                .precision(options.precision)
                .max_batch_tokens(options.max_batch_tokens.unwrap_or(MAX_AUTO_TOKENS))
                .max_batch_rows(options.max_batch_rows)
                .beam(options.beam.unwrap_or(4));
            if let Some(n) = options.max_new_tokens {
                builder = builder.max_new_tokens(n);
            }
            let translator = builder
                .build()
                .with_context(|| format!("loading --model {}", spec.model.display()))?;
            // (API code, model code, name) of each side.
            let side = |languages: &[candle_attention::Language]| -> Vec<(String, String, String)> {
                languages
                    .iter()
                    .filter_map(|l| {
                        api_code(l).map(|api| (api.clone(), l.code.clone(), api_name(&api, l)))
                    })
                    .collect()
            };
            let (sources, targets_of_model) = match (&spec.pair, translator.default_pair()) {
                (Some((s, t)), _) => {
                    // The model's own codes when it says them, else the pair as given.
                    let code = |api: &str, known: &[candle_attention::Language]| {
                        known
                            .iter()
                            .find(|l| api_code(l).as_deref() == Some(api) || l.code == api)
                            .map_or_else(|| api.to_string(), |l| l.code.clone())
                    };
                    let name = |api: &str| candle_attention::Language::from_code(api).name;
                    (
                        vec![(s.clone(), code(s, translator.source_languages()), name(s))],
                        vec![(t.clone(), code(t, translator.target_languages()), name(t))],
                    )
                }
                (None, Some(_)) | (None, None) => (
                    side(translator.source_languages()),
                    side(translator.target_languages()),
                ),
            };
            if sources.is_empty() || targets_of_model.is_empty() {
                anyhow::bail!(
                    "{} does not say which languages it translates (no source_lang / target_lang \
                     in its tokenizer_config.json): give them as --model SRC:TGT={}",
                    spec.model.display(),
                    spec.model.display()
                )
            }
            for (s_api, s_code, s_name) in &sources {
                if !wanted(s_api) {
                    continue;
                }
                for (t_api, t_code, t_name) in &targets_of_model {
                    if s_api == t_api || !wanted(t_api) {
                        continue;
                    }
                    routes
                        .entry((s_api.clone(), t_api.clone()))
                        .or_insert(Route {
                            model: index,
                            source: s_code.clone(),
                            target: t_code.clone(),
                        });
                    let entry = targets
                        .entry(s_api.clone())
                        .or_insert_with(|| (s_name.clone(), Vec::new()));
                    if !entry.1.contains(t_api) {
                        entry.1.push(t_api.clone());
                    }
                    targets
                        .entry(t_api.clone())
                        .or_insert_with(|| (t_name.clone(), Vec::new()));
                }
            }
            translators.push(Arc::new(translator));
        }
        if routes.is_empty() {
            anyhow::bail!("no language pair left to serve (check --languages)")
        }
        let languages = targets
            .into_iter()
            .map(|(code, (name, mut to))| {
                // Every language is its own target, as in LibreTranslate (argos adds an identity
                // translation for each): such a request gets its text back unchanged.
                to.push(code.clone());
                to.sort();
                ApiLanguage {
                    code,
                    name,
                    targets: to,
                }
            })
            .collect();
        for (index, translator) in translators.iter().enumerate() {
            if let Some(route) = routes.values().find(|r| r.model == index) {
                warm_up(translator, route).with_context(|| {
                    format!("warming up --model {}", models[index].model.display())
                })?;
            }
        }
        let budgets = match options.max_batch_tokens {
            Some(tokens) => vec![tokens; translators.len()],
            None => {
                // After the warm-up: the weights are packed and the first buffers touched, so
                // the resident set is what the server holds at rest.
                let rest = candle_attention::resident_memory();
                let per_token: Vec<u64> = translators
                    .iter()
                    .map(|t| {
                        let beams = t.generation_config().num_beams.unwrap_or(1);
                        bytes_per_token(t.model(), beams)
                    })
                    .collect();
                let budgets = auto_budgets(rest, &per_token);
                for ((spec, tokens), bytes) in models.iter().zip(&budgets).zip(&per_token) {
                    tracing::info!(
                        model = %spec.model.display(),
                        max_batch_tokens = tokens,
                        resident_mb_at_rest = rest.map(|b| b / 1_000_000),
                        batch_kb_per_token = bytes / 1_000,
                        "batch budget sized from the memory at rest (--max-batch-tokens sets it)"
                    );
                }
                budgets
            }
        };
        let beam = translators
            .iter()
            .map(|t| t.generation_config().num_beams.unwrap_or(1))
            .min()
            .unwrap_or(1);
        let shared = Arc::new(Shared::default());
        let worker = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("attn-engine".into())
            .spawn({
                let budgets = budgets.clone();
                move || run(&worker, &translators, &budgets)
            })
            .context("starting the engine thread")?;
        Ok(Engine {
            shared,
            routes,
            languages,
            beam,
            max_queue: options.max_queue.max(1),
            budgets,
            thread: Some(thread),
        })
    }

    /// Each model's token budget (`--model` order): `--max-batch-tokens`, or the one sized from
    /// the memory at rest.
    pub fn max_batch_tokens(&self) -> &[usize] {
        &self.budgets
    }
}

impl Backend for Engine {
    fn languages(&self) -> Vec<ApiLanguage> {
        self.languages.clone()
    }

    fn beam(&self) -> usize {
        self.beam
    }

    fn submit(&self, job: Job) -> Result<oneshot::Receiver<JobResult>, SubmitError> {
        let Some(route) = self
            .routes
            .get(&(job.source.clone(), job.target.clone()))
            .cloned()
        else {
            let known = self.languages.iter().any(|l| l.code == job.source);
            let missing = if known { &job.target } else { &job.source };
            return Err(SubmitError::Unsupported(format!(
                "{missing} is not supported"
            )));
        };
        let n = job.sentences.len();
        let mut inbox = self.shared.inbox.lock().unwrap_or_else(|e| e.into_inner());
        let queued = self.shared.queued.load(Ordering::SeqCst);
        // Bounded: a job that does not fit waits nowhere (one larger than the whole queue is
        // taken only when nothing waits).
        if queued > 0 && queued + n > self.max_queue {
            let running = self.shared.running_rows.load(Ordering::SeqCst).max(1);
            let retry_after_secs = (queued / running).clamp(1, 30) as u64;
            return Err(SubmitError::Overloaded { retry_after_secs });
        }
        // Bounded in time too: a job that the measured capacity cannot finish before its
        // deadline is refused now, rather than answered "timed out" when the deadline comes
        // (above capacity the queue would otherwise fill up with requests that all time out).
        let capacity = self.shared.capacity_milli.load(Ordering::Relaxed) as f64 / 1000.0;
        let ahead = self.shared.ahead.load(Ordering::SeqCst) + inbox_sentences(&inbox);
        let left = job.deadline.saturating_duration_since(Instant::now());
        if let Some(retry_after_secs) = too_late(capacity, ahead, n, left) {
            return Err(SubmitError::Overloaded { retry_after_secs });
        }
        let (tx, rx) = oneshot::channel();
        self.shared.queued.fetch_add(n, Ordering::SeqCst);
        inbox.jobs.push_back((job, route, tx));
        drop(inbox);
        self.shared.wake.notify_one();
        Ok(rx)
    }

    fn stats(&self) -> Stats {
        Stats {
            queued_sentences: self.shared.queued.load(Ordering::SeqCst),
            running_rows: self.shared.running_rows.load(Ordering::SeqCst),
            tokens_generated: self.shared.tokens.load(Ordering::SeqCst),
        }
    }
}

impl Drop for Engine {
    /// Stops the decoding thread; jobs still in it are answered [`JobError::Stopped`].
    fn drop(&mut self) {
        self.shared
            .inbox
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .stop = true;
        self.shared.wake.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The `Retry-After` for a job of `n` sentences behind `ahead` others that an engine finishing
/// `capacity` sentences a second (0: not measured) cannot finish within `left`; `None` when it
/// can, when nothing is ahead of it, or when the capacity is unknown.
fn too_late(capacity: f64, ahead: usize, n: usize, left: Duration) -> Option<u64> {
    if capacity <= 0.0 || ahead == 0 {
        return None;
    }
    let wait = (ahead + n) as f64 / capacity;
    let left = left.as_secs_f64();
    (wait > left).then(|| ((wait - left).ceil() as u64).clamp(1, 60))
}

/// Sentences of the jobs in the inbox.
fn inbox_sentences(inbox: &Inbox) -> usize {
    inbox.jobs.iter().map(|j| j.0.sentences.len()).sum()
}

/// The decoding loop, on the engine's own thread: takes jobs in, steps every model with work,
/// answers finished jobs, drops the sentences of jobs nobody waits for any more.
///
/// While there is work it runs on a thread of rayon's pool (the kernels' parallel loops then
/// include that thread: running them from outside the pool cost 10%); when there is none it
/// waits on its own thread. A job that blocks inside the pool holds one of its threads: an
/// idle engine waiting there left the pool a thread short, and with as many engines alive as
/// threads (the tests run several at once) rayon stacked one engine's wait under another's
/// and everything stopped.
fn run(shared: &Shared, translators: &[Arc<Translator>], budgets: &[usize]) {
    let mut batches: Vec<Continuous<'_>> = translators
        .iter()
        .zip(budgets)
        .map(|(t, &tokens)| {
            // `Engine::load` refused a zero budget and sizes none below 128, so this never
            // falls back to the translator's own budget.
            t.continuous()
                .with_max_batch_tokens(tokens)
                .unwrap_or_else(|_| t.continuous())
        })
        .collect();
    let mut jobs: HashMap<u64, Pending> = HashMap::new();
    // tag -> (job, sentence index)
    let mut owner: HashMap<u64, (u64, usize)> = HashMap::new();
    let mut next_job = 0u64;
    let mut next_tag = 0u64;
    let mut capacity = Capacity::new();
    // Steps until no model has anything to step, or the engine stops.
    let mut busy = || -> Pause {
        loop {
            let arrived = {
                let mut inbox = shared.inbox.lock().unwrap_or_else(|e| e.into_inner());
                if inbox.stop {
                    for (_, job) in jobs.drain() {
                        if let Some(reply) = job.reply {
                            let _ = reply.send(Err(JobError::Stopped));
                        }
                    }
                    for (_, _, reply) in inbox.jobs.drain(..) {
                        let _ = reply.send(Err(JobError::Stopped));
                    }
                    return Pause::Stopped;
                }
                std::mem::take(&mut inbox.jobs)
            };
            for (job, route, reply) in arrived {
                let id = next_job;
                next_job += 1;
                let options = TranslateOptions {
                    n_best: job.alternatives + 1,
                    ..TranslateOptions::default()
                };
                let mut pending = Pending {
                    reply: Some(reply),
                    results: vec![None; job.sentences.len()],
                    left: 0,
                    deadline: job.deadline,
                    tags: Vec::new(),
                    alternatives: job.alternatives,
                };
                let pair = Some((route.source.as_str(), route.target.as_str()));
                for (i, sentence) in job.sentences.iter().enumerate() {
                    if sentence.trim().is_empty() {
                        pending.results[i] = Some(Ok(Sentence {
                            text: sentence.clone(),
                            alternatives: Vec::new(),
                        }));
                        continue;
                    }
                    let tag = next_tag;
                    next_tag += 1;
                    match batches[route.model].push(tag, sentence, pair, &options) {
                        Ok(()) => {
                            owner.insert(tag, (id, i));
                            pending.tags.push((route.model, tag));
                            pending.left += 1;
                        }
                        Err(e) => pending.results[i] = Some(Err(e)),
                    }
                }
                jobs.insert(id, pending);
            }
            // Jobs nobody waits for (receiver dropped) or past their deadline leave the batch.
            let now = Instant::now();
            let gone: Vec<u64> = jobs
                .iter()
                .filter(|(_, j)| {
                    j.reply.as_ref().is_none_or(|r| r.is_closed()) || now >= j.deadline
                })
                .map(|(&id, _)| id)
                .collect();
            if !gone.is_empty() {
                for &id in &gone {
                    if let Some(job) = jobs.get(&id) {
                        for &(model, tag) in &job.tags {
                            batches[model].cancel(tag);
                        }
                    }
                }
                publish(shared, &batches, owner.len());
            }
            for id in gone {
                if let Some(mut job) = jobs.remove(&id) {
                    for &(model, tag) in &job.tags {
                        batches[model].cancel(tag);
                        owner.remove(&tag);
                    }
                    if let Some(reply) = job.reply.take() {
                        let _ = reply.send(Err(JobError::TimedOut));
                    }
                }
            }
            // One step of every model with work.
            let mut finished = 0;
            for batch in batches.iter_mut().filter(|b| !b.is_idle()) {
                for (tag, result) in batch.step() {
                    finished += 1;
                    let Some((id, i)) = owner.remove(&tag) else {
                        continue;
                    };
                    if let Some(job) = jobs.get_mut(&id) {
                        let alternatives = job.alternatives;
                        job.results[i] = Some(result.map(|t| {
                            Sentence {
                                alternatives: t
                                    .alternatives
                                    .into_iter()
                                    .skip(1)
                                    .take(alternatives)
                                    .map(|a| a.text)
                                    .collect(),
                                text: t.text,
                            }
                        }));
                        job.left -= 1;
                        job.tags.retain(|&(_, t)| t != tag);
                    }
                }
            }
            capacity.record(
                shared,
                finished,
                batches.iter().map(Continuous::waiting).sum(),
            );
            // The gauges first, so that whoever is answered next sees them current.
            publish(shared, &batches, owner.len());
            // Answer the jobs that are complete.
            let complete: Vec<u64> = jobs
                .iter()
                .filter(|(_, j)| j.left == 0)
                .map(|(&id, _)| id)
                .collect();
            for id in complete {
                if let Some(mut job) = jobs.remove(&id) {
                    let results = job
                        .results
                        .drain(..)
                        .map(|r| {
                            r.unwrap_or_else(|| Err(TranslateError::model("internal: no result")))
                        })
                        .collect();
                    if let Some(reply) = job.reply.take() {
                        let _ = reply.send(Ok(results));
                    }
                }
            }
            if batches.iter().all(Continuous::is_idle) {
                return match jobs.values().map(|j| j.deadline).min() {
                    None => Pause::Idle,
                    Some(deadline) => Pause::Watch(deadline),
                };
            }
        }
    };
    loop {
        let mut pause = Pause::Idle;
        rayon::scope(|s| s.spawn(|_| pause = busy()));
        // Nothing to step: wait here, off the pool, for a job (or, while a job with nothing
        // decoding is open, for its deadline, looking every 50 ms for a client that left).
        let watch = match pause {
            Pause::Stopped => return,
            Pause::Idle => None,
            Pause::Watch(deadline) => Some(
                deadline
                    .saturating_duration_since(Instant::now())
                    .min(Duration::from_millis(50)),
            ),
        };
        let mut inbox = shared.inbox.lock().unwrap_or_else(|e| e.into_inner());
        match watch {
            None => {
                while inbox.jobs.is_empty() && !inbox.stop {
                    inbox = shared.wake.wait(inbox).unwrap_or_else(|e| e.into_inner());
                }
            }
            Some(wait) if inbox.jobs.is_empty() && !inbox.stop => {
                let _ = shared.wake.wait_timeout(inbox, wait);
            }
            Some(_) => {}
        }
    }
}

/// Why the decoding loop stopped stepping ([`run`]).
enum Pause {
    /// The engine is stopping; every open job has been answered.
    Stopped,
    /// Nothing is open: wait for a job.
    Idle,
    /// Jobs are open but nothing decodes for them: wait for a job or until this deadline.
    Watch(Instant),
}

/// Stores the gauges (sentences waiting, rows running, tokens generated) for the HTTP side; called
/// before any job is answered, so that whoever is answered sees them current.
fn publish(shared: &Shared, batches: &[Continuous<'_>], decoding: usize) {
    let waiting: usize = batches.iter().map(Continuous::waiting).sum();
    let inbox: usize = shared
        .inbox
        .lock()
        .map(|i| inbox_sentences(&i))
        .unwrap_or(0);
    shared.ahead.store(decoding, Ordering::SeqCst);
    shared.queued.store(waiting + inbox, Ordering::SeqCst);
    shared.running_rows.store(
        batches.iter().map(Continuous::running_rows).sum(),
        Ordering::SeqCst,
    );
    shared.tokens.store(
        batches.iter().map(Continuous::tokens_generated).sum(),
        Ordering::SeqCst,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_the_capacity_cannot_finish_in_time_is_refused_with_the_wait_it_lacks() {
        let secs = Duration::from_secs;
        // 10 sentences a second, 50 ahead: 5.2 s for 2 more.
        assert_eq!(too_late(10.0, 50, 2, secs(60)), None);
        assert_eq!(too_late(10.0, 50, 2, secs(5)), Some(1));
        assert_eq!(too_late(10.0, 600, 2, secs(30)), Some(31));
        assert_eq!(too_late(0.1, 100_000, 2, secs(1)), Some(60));
        // Not measured yet, or nothing ahead: only the queue's bound applies.
        assert_eq!(too_late(0.0, 600, 2, secs(1)), None);
        assert_eq!(too_late(10.0, 0, 1000, secs(1)), None);
    }

    #[test]
    fn capacity_is_measured_only_while_work_waits() {
        let shared = Shared::default();
        let window = |finished, waiting| {
            let mut c = Capacity::new();
            c.start -= Capacity::WINDOW * 2;
            c.record(&shared, finished, waiting);
        };
        // Room to spare: the clients' rate, not the engine's.
        window(10, 0);
        assert_eq!(shared.capacity_milli.load(Ordering::Relaxed), 0);
        window(40, 3);
        let first = shared.capacity_milli.load(Ordering::Relaxed);
        assert!((9_000..=10_000).contains(&first), "{first}");
        window(80, 3);
        let smoothed = shared.capacity_milli.load(Ordering::Relaxed);
        assert!(smoothed > first && smoothed < 2 * first, "{smoothed}");
    }
}
