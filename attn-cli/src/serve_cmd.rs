//! `attn serve`: translation models behind LibreTranslate's HTTP API (`attn_cli::serve`).
//! Loads the models first, then binds (a server that answers is ready), serves until SIGTERM or
//! SIGINT, then stops accepting, finishes what is in flight and exits 0.

use crate::model_args::PrecisionArgs;
use crate::model_source::resolve_model;
use anyhow::{bail, Context, Result};
use attn_cli::serve::engine::{Engine, EngineOptions, ModelSpec};
use attn_cli::serve::http::limits::ApiKeys;
use attn_cli::serve::http::{self, Cors, ServeOptions, Settings};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// The server's row cap: smaller than the bulk path's, so that memory under load stays bounded
/// near its size at rest (see docs/serving.md, "Memory"). Its token budget is sized after
/// loading unless `--max-batch-tokens` gives it (`attn_cli::serve::budget`).
const DEFAULT_SERVE_BATCH_ROWS: usize = 64;

/// `attn serve --help`: examples and a systemd unit, after the options.
const EXAMPLES: &str = "\
Examples:
  attn serve --model opus-mt-en-de
      one MarianMT directory (its languages from tokenizer_config.json) on 127.0.0.1:5000
  attn serve --model en:de=Helsinki-NLP/opus-mt-en-de --model de:en=Helsinki-NLP/opus-mt-de-en
      two hub models, languages named
  attn serve --model facebook/nllb-200-distilled-600M --quantize int8 --beam 4 \\
             --char-limit 5000 --batch-limit 32 --req-limit 60 --api-keys keys.txt --host 0.0.0.0
      a multilingual model, int8, with LibreTranslate's limits and API keys
  curl -s localhost:5000/translate -H 'Content-Type: application/json' \\
       -d '{\"q\": \"Hello world\", \"source\": \"en\", \"target\": \"de\"}'
      {\"translatedText\":\"Hallo Welt\"}

The API is LibreTranslate 1.9's: POST /translate, POST /detect, POST /translate_file (.txt),
GET /languages, /health, /frontend/settings, /spec (Swagger 2.0); plus GET /metrics
(Prometheus) and GET / (a web page). Logs go to standard error (RUST_LOG=debug for more; RUST_LOG=warn for less).

--api-keys FILE, one key a line, optionally with its own limits (-1: none):
  # KEY                                 REQ_PER_MIN  CHAR_LIMIT
  4f1c2e0a-7b7e-4c1e-9a53-0d5c3c0e8a11  120          10000
  0b9d5f1e-2a44-4a4b-8f3e-6a7d3b6c1f20

A systemd unit (/etc/systemd/system/attn-serve.service; then systemctl enable --now attn-serve):
  [Unit]
  Description=attn serve (LibreTranslate API)
  After=network-online.target
  Wants=network-online.target

  [Service]
  ExecStart=/usr/local/bin/attn serve --model /srv/models/opus-mt-en-de --host 127.0.0.1 --port 5000 --threads 8
  Environment=HF_HUB_OFFLINE=1
  User=attn
  Restart=on-failure
  # SIGTERM: stop accepting, finish the requests in flight, exit 0.
  KillSignal=SIGTERM
  TimeoutStopSec=90
  NoNewPrivileges=true
  ProtectSystem=strict
  ProtectHome=true
  PrivateTmp=true

  [Install]
  WantedBy=multi-user.target";

/// `attn serve` options. Limits of -1 are "no limit", as in LibreTranslate.
#[derive(clap::Args, Debug)]
#[command(after_long_help = EXAMPLES)]
pub struct ServeArgs {
    /// A model to serve (repeat for more): a Hugging Face directory or hub id ORG/NAME, with
    /// its language pair in front where its files do not name it (LANGS=, e.g.
    /// en:de=opus-mt-en-de; LibreTranslate codes). A multilingual model serves every pair of
    /// its languages.
    #[arg(long = "model", value_name = "[LANGS=]DIR|ORG/NAME", required = true)]
    models: Vec<String>,
    /// Address to listen on (0.0.0.0: every interface).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on.
    #[arg(long, default_value_t = 5000)]
    port: u16,
    /// Beam width (1 = greedy); `alternatives` can ask for at most beam - 1. Default: the
    /// model's generation_config.json.
    #[arg(long, value_name = "N")]
    beam: Option<usize>,
    /// Most tokens to generate per sentence. Default: the model's generation_config.json.
    #[arg(long, value_name = "T")]
    max_new_tokens: Option<usize>,
    /// --dtype and --quantize.
    #[command(flatten)]
    precision: PrecisionArgs,
    /// Most padded source tokens (sentences × longest sentence, per cohort) of the sentences
    /// decoding at once in a model's running batch, all cohorts together: it bounds the
    /// running batch's memory. Default: sized after loading so that the running batches hold
    /// at most a quarter of the memory at rest, up to 1024 (a 300 MB f32 opus-mt model gets
    /// 1024, its int8 copy 320; the log says it).
    #[arg(long, value_name = "N")]
    max_batch_tokens: Option<usize>,
    /// Most decoder rows (sentences × beams) decoding at once: working memory grows with it.
    #[arg(long, value_name = "ROWS", default_value_t = DEFAULT_SERVE_BATCH_ROWS)]
    max_batch_rows: usize,
    /// Most sentences waiting for the batch; a request beyond it is answered at once with 429
    /// and Retry-After, never queued.
    #[arg(long, value_name = "SENTENCES", default_value_t = 4096)]
    max_queue: usize,
    /// Most characters per text of a request (400 "Invalid request: request (N) exceeds text
    /// limit (M)"); an API key's own limit wins. -1: none.
    #[arg(long, value_name = "N", default_value_t = -1, allow_negative_numbers = true)]
    char_limit: i64,
    /// Most texts in one request (`q` as a list). -1: none.
    #[arg(long, value_name = "N", default_value_t = -1, allow_negative_numbers = true)]
    batch_limit: i64,
    /// Requests per minute per client address (per API key with --api-keys) and route, over a
    /// moving minute (429 "Slowdown: N per 1 minute"); a list of N texts counts N. -1: none.
    #[arg(long, value_name = "PER_MIN", default_value_t = -1, allow_negative_numbers = true)]
    req_limit: i64,
    /// API keys, one a line, optionally followed by its requests per minute and character
    /// limit (`KEY [REQ_PER_MIN [CHAR_LIMIT]]`, -1: none; # comments). An unknown key is 403
    /// "Invalid API key"; no key is allowed unless --require-api-key.
    #[arg(long, value_name = "FILE")]
    api_keys: Option<PathBuf>,
    /// With --api-keys: a request without a key is 400 "Please contact the server operator to
    /// get an API key" (LibreTranslate's --under-attack).
    #[arg(long, alias = "under-attack", requires = "api_keys")]
    require_api_key: bool,
    /// With --require-api-key: where to get one, in its message ("Visit URL to get an API
    /// key").
    #[arg(long, value_name = "URL")]
    get_api_key_link: Option<String>,
    /// Most alternatives a request may ask for (never more than --beam - 1). -1: beam - 1.
    #[arg(long, value_name = "N", default_value_t = -1, allow_negative_numbers = true)]
    alternatives_limit: i64,
    /// Seconds a request may take, its body included: past it the answer is 408 (body still
    /// arriving) or 503 with Retry-After (translating), and its sentences leave the batch.
    #[arg(long, value_name = "SECS", default_value_t = 60)]
    request_timeout: u64,
    /// Largest request body, in bytes (K, M suffixes: 10M); 413 beyond.
    #[arg(long, value_name = "BYTES", default_value = "10M", value_parser = parse_bytes)]
    body_limit: usize,
    /// CORS: `*` (LibreTranslate's headers on every answer), a comma-separated list of
    /// origins (https://a.example,https://b.example), or `none`.
    #[arg(long, value_name = "ORIGINS", default_value = "*")]
    cors_origins: String,
    /// Behind a reverse proxy: limit clients by X-Forwarded-For's first address instead of
    /// the peer's (LibreTranslate always does; a client can forge it without a proxy).
    #[arg(long)]
    trust_forwarded_for: bool,
    /// Seconds a connection may take to send a request's headers (idle keep-alive ones
    /// included) before it is closed: slow clients hold no worker.
    #[arg(long, value_name = "SECS", default_value_t = 10)]
    header_read_timeout: u64,
    /// Connections open at once; more wait in the listen backlog.
    #[arg(long, value_name = "N", default_value_t = 1024)]
    max_connections: usize,
    /// On SIGTERM / SIGINT, seconds the requests in flight may still take. Default: the
    /// request timeout plus 5.
    #[arg(long, value_name = "SECS")]
    drain_timeout: Option<u64>,
    /// Threads that compute the translations. Default: every core (or RAYON_NUM_THREADS).
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
    /// Serve only these languages (LibreTranslate codes, comma-separated, e.g. en,de,fr);
    /// default: every language of the models.
    #[arg(long, value_name = "CODES", value_delimiter = ',')]
    languages: Vec<String>,
    /// POST /translate_file answers 403.
    #[arg(long)]
    disable_files_translation: bool,
    /// GET / answers 404.
    #[arg(long)]
    disable_web_ui: bool,
    /// GET /metrics wants `Authorization: Bearer TOKEN` (401 otherwise).
    #[arg(long, value_name = "TOKEN")]
    metrics_auth_token: Option<String>,
    /// frontendTimeout of /frontend/settings: the web page waits this many milliseconds after
    /// typing before it translates.
    #[arg(long, value_name = "MS", default_value_t = 500)]
    frontend_timeout: u64,
    /// Log lines as text or as JSON objects (one a line).
    #[arg(long, value_enum, default_value = "text")]
    log_format: LogFormat,
}

/// `--log-format` values.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object a line.
    Json,
}

/// `10M`, `512K`, `1048576`.
fn parse_bytes(s: &str) -> std::result::Result<usize, String> {
    let s = s.trim();
    let (digits, unit) = match s.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => s.split_at(i),
        None => (s, ""),
    };
    let n: usize = digits
        .parse()
        .map_err(|_| format!("{s:?}: expected a number of bytes, e.g. 10M"))?;
    let scale = match unit.to_ascii_uppercase().as_str() {
        "" | "B" => 1,
        "K" | "KB" | "KIB" => 1 << 10,
        "M" | "MB" | "MIB" => 1 << 20,
        "G" | "GB" | "GIB" => 1 << 30,
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (K, M, G)")),
    };
    n.checked_mul(scale)
        .ok_or_else(|| format!("{s:?}: too large"))
}

/// -1 (or any negative) is no limit.
fn limit(n: i64) -> Option<u64> {
    u64::try_from(n).ok()
}

/// `[LANGS=]DIR|ORG/NAME`: LANGS is `SRC:TGT` (letters, `-`, `_`), else the whole is the model.
fn parse_model(arg: &str) -> Result<ModelSpec> {
    let (pair, model) = match arg.split_once('=') {
        Some((langs, rest)) => match langs.split_once(':') {
            Some((s, t))
                if !s.is_empty()
                    && !t.is_empty()
                    && langs
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, ':' | '-' | '_')) =>
            {
                (Some((s.to_string(), t.to_string())), rest)
            }
            _ => (None, arg),
        },
        None => (None, arg),
    };
    if model.is_empty() {
        bail!("--model {arg}: no model after the languages");
    }
    let dir = resolve_model(std::path::Path::new(model))?;
    Ok(ModelSpec { pair, model: dir })
}

fn settings(args: &ServeArgs) -> Result<Settings> {
    let api_keys = match &args.api_keys {
        Some(path) => Some(ApiKeys::load(path).map_err(anyhow::Error::msg)?),
        None => None,
    };
    let cors = match args.cors_origins.trim() {
        "*" => Cors::Any,
        "" | "none" => Cors::Off,
        list => Cors::Origins(
            list.split(',')
                .map(|o| o.trim().trim_end_matches('/').to_string())
                .filter(|o| !o.is_empty())
                .collect(),
        ),
    };
    if args.request_timeout == 0 {
        bail!("--request-timeout must be at least 1 second");
    }
    let req_limit = limit(args.req_limit).filter(|&n| n > 0 || api_keys.is_some());
    Ok(Settings {
        char_limit: limit(args.char_limit).map(|n| n as usize),
        batch_limit: limit(args.batch_limit).map(|n| n as usize),
        req_limit,
        api_keys,
        require_api_key: args.require_api_key,
        get_api_key_link: args.get_api_key_link.clone(),
        alternatives_limit: limit(args.alternatives_limit).map(|n| n as usize),
        request_timeout: Duration::from_secs(args.request_timeout),
        body_limit: args.body_limit,
        cors,
        trust_forwarded_for: args.trust_forwarded_for,
        frontend_timeout_ms: args.frontend_timeout,
        disable_files_translation: args.disable_files_translation,
        disable_web_ui: args.disable_web_ui,
        metrics_auth_token: args.metrics_auth_token.clone(),
    })
}

fn init_logs(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

/// Resolves on SIGINT (Ctrl-C) or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => tracing::info!("SIGINT: draining"),
        _ = term => tracing::info!("SIGTERM: draining"),
    }
}

/// Runs `attn serve`.
pub fn run(args: &ServeArgs) -> Result<()> {
    init_logs(args.log_format);
    if args.beam == Some(0) {
        bail!("--beam must be at least 1");
    }
    let settings = settings(args)?;
    let specs = args
        .models
        .iter()
        .map(|m| parse_model(m))
        .collect::<Result<Vec<_>>>()?;
    let options = EngineOptions {
        beam: args.beam,
        max_new_tokens: args.max_new_tokens,
        precision: args.precision.precision(),
        max_batch_tokens: args.max_batch_tokens,
        max_batch_rows: args.max_batch_rows,
        max_queue: args.max_queue,
        languages: args.languages.clone(),
    };
    if let Some(threads) = args.threads {
        if threads == 0 {
            bail!("--threads must be at least 1");
        }
        // The kernels' pool, before anything uses it.
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build_global()
            .context("setting the number of compute threads")?;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("attn-serve-io")
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let started = std::time::Instant::now();
        tracing::info!(models = specs.len(), "loading");
        let engine = tokio::task::spawn_blocking(move || Engine::load(specs, options))
            .await
            .context("loading the models")??;
        let backend: Arc<dyn attn_cli::serve::backend::Backend> = Arc::new(engine);
        for l in backend.languages() {
            tracing::info!(code = %l.code, targets = %l.targets.join(","), "language");
        }
        tracing::info!(seconds = started.elapsed().as_secs_f64(), "models loaded");
        // Bind only now: a server that answers has its models.
        let addr = format!("{}:{}", args.host, args.port);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .with_context(|| format!("listening on {addr}"))?;
        tracing::info!(address = %listener.local_addr()?, "ready: http://{}/", listener.local_addr()?);
        let drain = args
            .drain_timeout
            .unwrap_or(args.request_timeout.saturating_add(5));
        let app = http::app(backend, settings);
        http::serve_with(
            listener,
            app,
            shutdown_signal(),
            ServeOptions {
                header_read_timeout: Duration::from_secs(args.header_read_timeout.max(1)),
                max_connections: args.max_connections,
                drain_timeout: Some(Duration::from_secs(drain)),
            },
        )
        .await
        .context("serving")?;
        tracing::info!("stopped");
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes() {
        assert_eq!(parse_bytes("10M"), Ok(10 << 20));
        assert_eq!(parse_bytes("512k"), Ok(512 << 10));
        assert_eq!(parse_bytes("100"), Ok(100));
        assert!(parse_bytes("1X").is_err());
        assert!(parse_bytes("M").is_err());
    }

    #[test]
    fn limits() {
        assert_eq!(limit(-1), None);
        assert_eq!(limit(0), Some(0));
        assert_eq!(limit(5), Some(5));
    }
}
