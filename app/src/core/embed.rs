//! all-MiniLM-L6-v2 in candle: 384-d sentence vectors (attention-mask mean pooling,
//! L2-normalised). One model per process, shared by two lanes (search queries, memories), each
//! a dedicated thread that micro-batches the requests queued while it was busy, so the async
//! threads never run the model.
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use anyhow::{anyhow, Context};
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config};
use tokenizers::{PaddingParams, PaddingStrategy, Tokenizer, TruncationParams};
use tokio::sync::{mpsc, oneshot};

use super::encoder::Layer;

/// The model's name, stored beside every vector.
pub const MODEL_NAME: &str = "all-MiniLM-L6-v2";
/// Vector dimension.
pub const DIM: usize = 384;
/// Most texts in one forward pass.
pub const MAX_BATCH: usize = 16;
/// Tokens kept per text.
pub const MAX_TOKENS: usize = 256;

/// The loaded model and tokenizer.
///
/// The model runs one encoder layer at a time (our `encoder::Layer`; candle's `BertModel` runs
/// all six in one call), so the bulk lane can pause between layers when the API is busy: a
/// forward pass of a full batch takes a hundred milliseconds or more, a layer a sixth of that.
pub struct Embedder {
    /// The embedding layer: candle's BERT loaded with no encoder layers.
    embeddings: BertModel,
    /// The encoder's layers in order.
    layers: Vec<Layer>,
    tokenizer: Tokenizer,
    device: Device,
}

impl Embedder {
    /// Loads `config.json`, `tokenizer.json` and `model.safetensors` from `dir`.
    pub fn load(dir: &Path) -> anyhow::Result<Self> {
        let device = Device::Cpu;
        let config: Config = serde_json::from_str(
            &std::fs::read_to_string(dir.join("config.json")).with_context(|| {
                format!("reading {}/config.json (run `make setup`)", dir.display())
            })?,
        )?;
        let mut tokenizer = Tokenizer::from_file(dir.join("tokenizer.json"))
            .map_err(|e| anyhow!("loading tokenizer: {e}"))?;
        // The shipped tokenizer pads and truncates to a fixed 128: pad to the longest text of the
        // batch instead, and keep up to 256 tokens.
        tokenizer.with_padding(Some(PaddingParams {
            strategy: PaddingStrategy::BatchLongest,
            ..Default::default()
        }));
        tokenizer
            .with_truncation(Some(TruncationParams {
                max_length: MAX_TOKENS,
                ..Default::default()
            }))
            .map_err(|e| anyhow!("setting truncation: {e}"))?;
        // SAFETY: the weights file is memory-mapped read-only and not modified while mapped.
        let vb = unsafe {
            VarBuilder::from_mmaped_safetensors(
                &[dir.join("model.safetensors")],
                DType::F32,
                &device,
            )?
        };
        let embeddings = BertModel::load(
            vb.clone(),
            &Config {
                num_hidden_layers: 0,
                ..config.clone()
            },
        )?;
        let layers = (0..config.num_hidden_layers)
            .map(|i| Layer::load(vb.pp(format!("encoder.layer.{i}")), &config))
            .collect::<candle_core::Result<Vec<_>>>()?;
        Ok(Self {
            embeddings,
            layers,
            tokenizer,
            device,
        })
    }

    /// Embeds a batch of texts (blocking).
    pub fn embed_batch(&self, texts: &[String]) -> anyhow::Result<Vec<Vec<f32>>> {
        self.embed_batch_pausing(texts, &mut || {})
    }

    /// Embeds a batch of texts (blocking), calling `before_layer` before each encoder layer.
    ///
    /// A forward pass pads every text to the longest of its batch, so a batch of real
    /// conversation turns (mean ~140 characters, some 450) spends much of its work on padding.
    /// The texts are sorted by length and run in groups that pad little ([`length_groups`]);
    /// the answers come back in the callers' order.
    pub fn embed_batch_pausing(
        &self,
        texts: &[String],
        before_layer: &mut dyn FnMut(),
    ) -> anyhow::Result<Vec<Vec<f32>>> {
        if texts.len() <= 1 || !length_grouping() {
            return self.embed_group(texts, before_layer);
        }
        let lengths: Vec<usize> = texts
            .iter()
            .map(|t| {
                self.tokenizer
                    .encode(t.as_str(), true)
                    .map(|e| e.get_ids().len().min(MAX_TOKENS))
                    .unwrap_or(MAX_TOKENS)
            })
            .collect();
        let mut out: Vec<Vec<f32>> = vec![vec![]; texts.len()];
        for group in length_groups(&lengths) {
            let batch: Vec<String> = group.iter().map(|&i| texts[i].clone()).collect();
            for (i, v) in group
                .into_iter()
                .zip(self.embed_group(&batch, before_layer)?)
            {
                out[i] = v;
            }
        }
        Ok(out)
    }

    /// One forward pass over `texts`, padded to the longest.
    fn embed_group(
        &self,
        texts: &[String],
        before_layer: &mut dyn FnMut(),
    ) -> anyhow::Result<Vec<Vec<f32>>> {
        if texts.is_empty() {
            return Ok(vec![]);
        }
        let encodings = self
            .tokenizer
            .encode_batch(texts.to_vec(), true)
            .map_err(|e| anyhow!("tokenizing: {e}"))?;
        let len = encodings[0].get_ids().len();
        let n = encodings.len();
        let mut ids = Vec::with_capacity(n * len);
        let mut types = Vec::with_capacity(n * len);
        let mut mask = Vec::with_capacity(n * len);
        for e in &encodings {
            ids.extend_from_slice(e.get_ids());
            types.extend_from_slice(e.get_type_ids());
            mask.extend(e.get_attention_mask().iter().map(|&m| m as f32));
        }
        let ids = Tensor::from_vec(ids, (n, len), &self.device)?;
        let types = Tensor::from_vec(types, (n, len), &self.device)?;
        let mask = Tensor::from_vec(mask, (n, len), &self.device)?;
        // The embedding layer's output, (n, len, 384).
        let mut hidden = self.embeddings.forward(&ids, &types, Some(&mask))?;
        // As BERT's extended attention mask: 0 where attended, the lowest float where padded.
        let blocked = (mask.ones_like()? - &mask)?
            .broadcast_mul(&Tensor::new(f32::MIN, &self.device)?)?
            .reshape((n, 1, 1, len))?;
        for layer in &self.layers {
            before_layer();
            hidden = layer.forward(&hidden, &blocked)?;
        }
        let mask3 = mask.unsqueeze(2)?; // (n, len, 1)
        let summed = hidden.broadcast_mul(&mask3)?.sum(1)?; // (n, 384)
        let counts = mask3.sum(1)?.clamp(1e-9, f64::MAX)?; // (n, 1)
        let mean = summed.broadcast_div(&counts)?;
        let norms = mean.sqr()?.sum_keepdim(1)?.sqrt()?.clamp(1e-12, f64::MAX)?;
        let normalised = mean.broadcast_div(&norms)?;
        Ok(normalised.to_vec2::<f32>()?)
    }
}

/// Padding a group may add, as a share of its real tokens, before a longer text starts a new
/// group.
const GROUP_PADDING: f64 = 0.25;

/// Whether batches are split by length (`ENGRAM_EMBED_LENGTH_GROUPS=off` turns it off, for the
/// bench's comparison).
fn length_grouping() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("ENGRAM_EMBED_LENGTH_GROUPS").as_deref() != Ok("off"))
}

/// The texts' indexes in groups for forward passes: shortest first, each group growing while
/// padding every member to its longest costs at most [`GROUP_PADDING`] more than its real
/// tokens.
pub fn length_groups(lengths: &[usize]) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..lengths.len()).collect();
    order.sort_by_key(|&i| lengths[i]);
    let mut groups: Vec<Vec<usize>> = vec![];
    let mut current: Vec<usize> = vec![];
    let mut real = 0usize;
    for i in order {
        let len = lengths[i].max(1);
        let padded = (current.len() + 1) * len;
        if !current.is_empty() && padded as f64 > (1.0 + GROUP_PADDING) * (real + len) as f64 {
            groups.push(std::mem::take(&mut current));
            real = 0;
        }
        current.push(i);
        real += len;
    }
    if !current.is_empty() {
        groups.push(current);
    }
    groups
}

type Reply = oneshot::Sender<Result<Vec<f32>, String>>;
type Queue = mpsc::UnboundedSender<(String, Reply)>;

/// Which queue a text waits in. Each lane has its own model thread over the one shared model, so
/// a search never waits behind a batch of memories being ingested.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lane {
    /// Search queries: somebody waits for the answer.
    Query = 0,
    /// Memories being ingested: batches of up to `MAX_BATCH`, for throughput.
    Bulk = 1,
}

struct Inner {
    dir: PathBuf,
    model: OnceLock<Result<Arc<Embedder>, String>>,
    lanes: [OnceLock<Queue>; 2],
    stats: [Arc<EmbedStats>; 2],
    foreground: Arc<Foreground>,
    queries: Mutex<QueryCache>,
}

/// The embeddings of recent search queries, by exact text: a query asked again (an agent
/// recalling the same thing each turn, a user paging through results) skips the model, which is
/// most of a search's time. Two generations approximate least-recently-used: a hit moves to the
/// current one; when the current one is full it becomes the previous one, and the old previous
/// one is dropped. `QUERY_CACHE` entries at most (about 1.5 KiB each).
#[derive(Default)]
struct QueryCache {
    capacity: usize,
    current: HashMap<String, Vec<f32>>,
    previous: HashMap<String, Vec<f32>>,
}

/// Query embeddings kept by default (twice this at most, across both generations: 6 MiB).
pub const QUERY_CACHE: usize = 2048;

impl QueryCache {
    fn get(&mut self, text: &str) -> Option<Vec<f32>> {
        if let Some(v) = self.current.get(text) {
            return Some(v.clone());
        }
        let v = self.previous.remove(text)?;
        self.put(text, v.clone());
        Some(v)
    }

    fn put(&mut self, text: &str, v: Vec<f32>) {
        if self.capacity == 0 {
            return;
        }
        if self.current.len() >= self.capacity {
            self.previous = std::mem::take(&mut self.current);
        }
        self.current.insert(text.to_string(), v);
    }
}

/// Pressure on the API that the bulk lane yields to, like a background job's cost delay.
///
/// On this 2-core VM a memory's acknowledgement waits on a chain of hand-offs (HTTP, the memory
/// writer, PostgreSQL and back), and any core the model keeps busy slows every link, whatever
/// the model thread's priority: with a CPU-bound loop beside the server, even under
/// `SCHED_IDLE`, 64 clients posting as fast as answered got 10-12k acknowledgements/s at p95
/// 10-12 ms instead of 13-19k/s at p95 5-10 ms (`bench ingest` without the worker, three
/// rounds of 10,000 each). So while the writer finds requests queueing up, the model pauses
/// before its next encoder layer (a pass over a full batch is six layers of 20-30 ms each, so
/// a burst is not left to share the cores with a whole pass). The pause is bounded: at most
/// [`MAX_YIELD`] at a time, and the lane then runs at least as long as it paused before it
/// pauses again (while memories are queued; once it has caught up it owes nothing), so under
/// endless pressure ingestion still runs at half speed or better. Ingestion is the queue's
/// business and a burst of writes is over in a second or two; the writes' acknowledgements are
/// what a client waits for.
pub struct Foreground {
    epoch: std::time::Instant,
    /// Microseconds after `epoch` until which the API counts as busy.
    busy_until_us: AtomicU64,
    /// Signs of pressure so far.
    presses: AtomicU64,
}

/// Longest the bulk lane pauses at a time.
pub const MAX_YIELD: std::time::Duration = std::time::Duration::from_secs(1);
/// How long one sign of pressure lasts.
const PRESSURE_HOLD: std::time::Duration = std::time::Duration::from_millis(50);

impl Default for Foreground {
    fn default() -> Self {
        Self {
            epoch: std::time::Instant::now(),
            busy_until_us: AtomicU64::new(0),
            presses: AtomicU64::new(0),
        }
    }
}

impl Foreground {
    fn now_us(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64
    }

    /// Requests are queueing up: the API counts as busy for a while.
    pub fn pressed(&self) {
        let until = self.now_us() + PRESSURE_HOLD.as_micros() as u64;
        self.busy_until_us.fetch_max(until, Ordering::Relaxed);
        self.presses.fetch_add(1, Ordering::Relaxed);
    }

    /// Signs of pressure reported so far.
    pub fn presses(&self) -> u64 {
        self.presses.load(Ordering::Relaxed)
    }

    /// Whether the API is under pressure now.
    fn busy(&self) -> bool {
        self.now_us() < self.busy_until_us.load(Ordering::Relaxed)
    }

    /// Blocks the calling (model) thread while the API is busy, `cap` at most; how long it
    /// waited.
    fn wait_quiet(&self, cap: std::time::Duration) -> std::time::Duration {
        if !self.busy() {
            return std::time::Duration::ZERO;
        }
        let start = std::time::Instant::now();
        while self.busy() && start.elapsed() < cap {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        start.elapsed()
    }
}

/// What a lane's model thread has done so far (benchmarks read it to see how busy it was).
#[derive(Default, Debug)]
pub struct EmbedStats {
    /// Forward passes run.
    pub batches: AtomicU64,
    /// Texts embedded.
    pub texts: AtomicU64,
    /// Time spent in forward passes (pauses not counted), in nanoseconds.
    pub busy_ns: AtomicU64,
    /// Time the lane waited for the API to be quiet, in nanoseconds.
    pub yielded_ns: AtomicU64,
}

/// A cheap handle to the process's one model; the model loads on first use.
#[derive(Clone)]
pub struct EmbedderHandle {
    inner: Arc<Inner>,
}

impl EmbedderHandle {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            inner: Arc::new(Inner {
                dir: dir.into(),
                model: OnceLock::new(),
                lanes: Default::default(),
                stats: Default::default(),
                foreground: Default::default(),
                queries: Mutex::new(QueryCache {
                    capacity: QUERY_CACHE,
                    ..Default::default()
                }),
            }),
        }
    }

    /// Sets how many query embeddings are kept (0: none) and forgets those kept. Benchmarks
    /// that time the model turn it off.
    pub fn set_query_cache(&self, capacity: usize) {
        *self.inner.queries.lock().unwrap_or_else(|p| p.into_inner()) = QueryCache {
            capacity,
            ..Default::default()
        };
    }

    /// Counters of one lane's model thread.
    pub fn stats(&self, lane: Lane) -> &EmbedStats {
        &self.inner.stats[lane as usize]
    }

    /// Where the API reports pressure that the bulk lane yields to.
    pub fn foreground(&self) -> Arc<Foreground> {
        self.inner.foreground.clone()
    }

    /// The model directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    fn queue(&self, lane: Lane) -> &Queue {
        self.inner.lanes[lane as usize].get_or_init(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            let inner = self.inner.clone();
            // Each lane runs on the one thread of its own rayon pool: candle's softmax and layer
            // norm (and the tokenizer) use rayon, and called from any other thread each of them
            // would wait for a pool thread to be scheduled, 19 hand-offs per forward pass, each
            // delayed whenever the other core is busy.
            let name = format!("embed-{lane:?}").to_lowercase();
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(1)
                .thread_name(move |_| name.clone())
                .start_handler(move |_| {
                    if lane == Lane::Bulk {
                        lower_priority();
                    }
                })
                .build()
                .expect("building an embedder thread pool");
            std::thread::Builder::new()
                .name("embed-owner".into())
                .spawn(move || {
                    pool.install(|| {
                        let model = inner
                            .model
                            .get_or_init(|| {
                                Embedder::load(&inner.dir)
                                    .map(Arc::new)
                                    .map_err(|e| format!("{e:#}"))
                            })
                            .clone();
                        if let Err(e) = &model {
                            tracing::error!(error = %e, "loading the embedding model failed");
                        }
                        let yield_to = (lane == Lane::Bulk).then_some(&*inner.foreground);
                        run_model(model, rx, &inner.stats[lane as usize], yield_to)
                    })
                })
                .expect("spawning an embedder thread");
            tx
        })
    }

    /// Embeds one text in `lane`; concurrent calls are batched together.
    pub async fn embed_in(&self, lane: Lane, text: &str) -> anyhow::Result<Vec<f32>> {
        let (tx, rx) = oneshot::channel();
        self.queue(lane)
            .send((text.to_string(), tx))
            .map_err(|_| anyhow!("embedder thread stopped"))?;
        rx.await
            .map_err(|_| anyhow!("embedder thread stopped"))?
            .map_err(|e| anyhow!(e))
    }

    /// Embeds a search query (the query lane), or answers it from the recent queries' cache.
    pub async fn embed_query(&self, text: &str) -> anyhow::Result<Vec<f32>> {
        let cached = self
            .inner
            .queries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(text);
        if let Some(v) = cached {
            metrics::counter!("engram_query_cache_total", "result" => "hit").increment(1);
            return Ok(v);
        }
        metrics::counter!("engram_query_cache_total", "result" => "miss").increment(1);
        let v = self.embed_in(Lane::Query, text).await?;
        self.inner
            .queries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .put(text, v.clone());
        Ok(v)
    }

    /// Embeds one memory (the bulk lane).
    pub async fn embed(&self, text: &str) -> anyhow::Result<Vec<f32>> {
        self.embed_in(Lane::Bulk, text).await
    }

    /// Embeds many texts in the bulk lane, batched.
    pub async fn embed_many(&self, texts: &[String]) -> anyhow::Result<Vec<Vec<f32>>> {
        let futures = texts.iter().map(|t| self.embed(t));
        futures::future::try_join_all(futures).await
    }

    /// Loads the model and starts both lanes now (start-up), so the first request does not pay.
    pub async fn warm_up(&self) -> anyhow::Result<()> {
        self.embed_in(Lane::Bulk, "warm up").await?;
        self.embed_in(Lane::Query, "warm up").await.map(|_| ())
    }
}

/// When the bulk lane pauses for the API (see [`Foreground`]): before each encoder layer,
/// unless it still owes running time for its last pause.
struct Yielder<'a> {
    foreground: Option<&'a Foreground>,
    stats: &'a EmbedStats,
    /// Running time owed for the last pause.
    owed: std::time::Duration,
    /// Since when the lane has been running (for `owed`).
    running_since: std::time::Instant,
    /// Time paused so far.
    paused: std::time::Duration,
}

impl<'a> Yielder<'a> {
    fn new(foreground: Option<&'a Foreground>, stats: &'a EmbedStats) -> Self {
        Self {
            foreground,
            stats,
            owed: std::time::Duration::ZERO,
            running_since: std::time::Instant::now(),
            paused: std::time::Duration::ZERO,
        }
    }

    /// Caught up (its queue found empty): no backlog left to keep moving, nothing owed.
    fn caught_up(&mut self) {
        self.owed = std::time::Duration::ZERO;
    }

    /// About to run more of the model: pauses while the API is busy, if nothing is owed.
    fn checkpoint(&mut self) {
        let Some(foreground) = self.foreground else {
            return;
        };
        self.owed = self.owed.saturating_sub(self.running_since.elapsed());
        if self.owed.is_zero() {
            let waited = foreground.wait_quiet(MAX_YIELD);
            self.owed = waited;
            self.paused += waited;
            self.stats
                .yielded_ns
                .fetch_add(waited.as_nanos() as u64, Ordering::Relaxed);
        }
        self.running_since = std::time::Instant::now();
    }
}

/// A lane's model thread: waits for a request, takes whatever else is queued (up to a batch),
/// runs one forward pass and answers each caller. The bulk lane yields to the API between
/// layers ([`Yielder`]).
fn run_model(
    model: Result<Arc<Embedder>, String>,
    mut rx: mpsc::UnboundedReceiver<(String, Reply)>,
    stats: &EmbedStats,
    yield_to: Option<&Foreground>,
) {
    let mut yielder = Yielder::new(yield_to, stats);
    loop {
        let first = match rx.try_recv() {
            Ok(item) => item,
            Err(mpsc::error::TryRecvError::Empty) => {
                yielder.caught_up();
                match rx.blocking_recv() {
                    Some(item) => item,
                    None => break,
                }
            }
            Err(mpsc::error::TryRecvError::Disconnected) => break,
        };
        // A pause before the pass, while the batch fills up.
        yielder.checkpoint();
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(item) => batch.push(item),
                Err(_) => break,
            }
        }
        let (texts, replies): (Vec<String>, Vec<Reply>) = batch.into_iter().unzip();
        let started = std::time::Instant::now();
        let paused_before = yielder.paused;
        let result = match &model {
            Ok(m) => m
                .embed_batch_pausing(&texts, &mut || yielder.checkpoint())
                .map_err(|e| format!("{e:#}")),
            Err(e) => Err(e.clone()),
        };
        let paused = yielder.paused - paused_before;
        let lane = if yield_to.is_some() { "bulk" } else { "query" };
        metrics::histogram!("engram_embed_batch_size", "lane" => lane).record(texts.len() as f64);
        stats.batches.fetch_add(1, Ordering::Relaxed);
        stats.texts.fetch_add(texts.len() as u64, Ordering::Relaxed);
        stats.busy_ns.fetch_add(
            started.elapsed().saturating_sub(paused).as_nanos() as u64,
            Ordering::Relaxed,
        );
        match result {
            Ok(vectors) => {
                for (reply, v) in replies.into_iter().zip(vectors) {
                    let _ = reply.send(Ok(v));
                }
            }
            Err(e) => {
                for reply in replies {
                    let _ = reply.send(Err(e.clone()));
                }
            }
        }
    }
}

/// Cosine similarity of two L2-normalised vectors.
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// The model directory for tests: `ENGRAM_MODEL_DIR` or the workspace's `models/`.
pub fn default_model_dir() -> PathBuf {
    std::env::var("ENGRAM_MODEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../models/all-MiniLM-L6-v2"
            ))
        })
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_query_cache_keeps_recent_queries_in_two_generations() {
        let mut c = QueryCache {
            capacity: 2,
            ..Default::default()
        };
        c.put("a", vec![1.0]);
        c.put("b", vec![2.0]);
        c.put("c", vec![3.0]); // current full: a and b become the previous generation
        assert_eq!(c.get("a"), Some(vec![1.0])); // a hit moves it back to the current one
        c.put("d", vec![4.0]); // current (c, a) full: b is dropped
        assert_eq!(c.get("b"), None);
        assert_eq!(c.get("a"), Some(vec![1.0]));
        assert_eq!(c.get("d"), Some(vec![4.0]));
        let mut off = QueryCache::default();
        off.put("a", vec![1.0]);
        assert_eq!(off.get("a"), None);
    }

    use super::*;

    /// Parity with sentence-transformers on the shared golden set.
    #[test]
    fn vectors_match_the_reference_implementation() {
        let golden: serde_json::Value =
            serde_json::from_str(include_str!("../../data/embedding_golden.json")).unwrap();
        let texts: Vec<String> = serde_json::from_value(golden["texts"].clone()).unwrap();
        let reference = &golden["all-MiniLM-L6-v2"];
        let vectors: Vec<Vec<f32>> = serde_json::from_value(reference["vectors"].clone()).unwrap();
        let model = Embedder::load(&default_model_dir()).unwrap();
        // Once as a batch (padding exercised), once one by one.
        let batched = model.embed_batch(&texts).unwrap();
        let mut lowest = f32::MAX;
        for (i, text) in texts.iter().enumerate() {
            let single = model
                .embed_batch(std::slice::from_ref(text))
                .unwrap()
                .remove(0);
            assert_eq!(single.len(), DIM);
            let c1 = cosine(&single, &vectors[i]);
            let c2 = cosine(&batched[i], &vectors[i]);
            assert!(
                c1 > 0.9999 && c2 > 0.9999,
                "text {i} {text:?}: cosine {c1} / {c2}"
            );
            lowest = lowest.min(c1).min(c2);
        }
        println!("lowest cosine to sentence-transformers: {lowest}");
        // Layer by layer with a pause point before each of the six (of each length group's
        // pass): the same vectors.
        let mut points = 0;
        let paused = model
            .embed_batch_pausing(&texts, &mut || points += 1)
            .unwrap();
        assert!(points >= 6 && points % 6 == 0, "{points}");
        assert_eq!(paused, batched);
    }

    #[test]
    fn length_groups_cover_every_text_once_and_pad_little() {
        let lengths = [40, 12, 110, 13, 35, 11, 256, 14, 38, 90];
        let groups = length_groups(&lengths);
        let mut seen: Vec<usize> = groups.concat();
        seen.sort();
        assert_eq!(seen, (0..lengths.len()).collect::<Vec<_>>());
        for g in &groups {
            let longest = g.iter().map(|&i| lengths[i]).max().unwrap();
            let real: usize = g.iter().map(|&i| lengths[i]).sum();
            assert!(
                (g.len() * longest) as f64 <= 1.25 * real as f64 || g.len() == 1,
                "{groups:?}"
            );
        }
        // The short ones go together; the 256-token text alone.
        assert!(
            groups
                .iter()
                .any(|g| g.len() == 4 && g.iter().all(|&i| lengths[i] < 20)),
            "{groups:?}"
        );
        assert!(groups.contains(&vec![6]));
        assert_eq!(length_groups(&[7, 7, 7]), vec![vec![0, 1, 2]]);
    }

    /// Pressure that begins while the bulk lane is in the middle of a forward pass pauses the
    /// pass at its next layer. (Were the lane to pause only before a pass, it would not pause
    /// here at all: nothing is queued behind the batch.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn pressure_during_a_pass_pauses_it_between_layers() {
        let embedder = EmbedderHandle::new(default_model_dir());
        embedder.warm_up().await.unwrap();
        let stats = embedder.stats(Lane::Bulk);
        let long: Vec<String> = (0..MAX_BATCH)
            .map(|i| {
                format!("memory {i}: ") + &"the quick brown fox jumps over the lazy dog ".repeat(10)
            })
            .collect();
        // The premise: a pass over this batch, unpressed, takes well over the 50 ms below.
        let busy = stats.busy_ns.load(Ordering::Relaxed);
        embedder.embed_many(&long).await.unwrap();
        let pass = std::time::Duration::from_nanos(stats.busy_ns.load(Ordering::Relaxed) - busy);
        assert!(
            pass > std::time::Duration::from_millis(200),
            "one pass took {pass:?}"
        );

        let yielded = stats.yielded_ns.load(Ordering::Relaxed);
        let pass_done = {
            let (embedder, long) = (embedder.clone(), long.clone());
            tokio::spawn(async move { embedder.embed_many(&long).await })
        };
        // The pass has begun, unpressed; pressure from now until the lane has paused once (a
        // pause is counted when it ends) or the pass is over without one.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        while stats.yielded_ns.load(Ordering::Relaxed) == yielded && !pass_done.is_finished() {
            embedder.foreground().pressed();
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let answered = pass_done.await.unwrap().unwrap();
        assert_eq!(answered.len(), MAX_BATCH);
        // It paused at the next layer, the whole MAX_YIELD (the pressure lasted), and then
        // finished the pass.
        let paused =
            std::time::Duration::from_nanos(stats.yielded_ns.load(Ordering::Relaxed) - yielded);
        assert!(
            paused >= MAX_YIELD && paused < MAX_YIELD * 2,
            "the pass paused {paused:?}"
        );
    }

    /// While the API is under pressure the bulk lane pauses before its next layer, for
    /// `MAX_YIELD` at most, and then, while texts are queued, runs at least as long as it paused
    /// before it pauses again; the query lane never pauses, and without pressure neither does
    /// the bulk lane.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_bulk_lane_yields_to_the_api_for_a_bounded_time() {
        let embedder = EmbedderHandle::new(default_model_dir());
        embedder.warm_up().await.unwrap();
        let yielded = |lane| {
            std::time::Duration::from_nanos(embedder.stats(lane).yielded_ns.load(Ordering::Relaxed))
        };
        embedder.embed("no pressure yet").await.unwrap();
        assert_eq!(yielded(Lane::Bulk), std::time::Duration::ZERO);

        // Pressure that never lets up (on before the next text is sent).
        embedder.foreground().pressed();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let presser = {
            let (foreground, stop) = (embedder.foreground(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    foreground.pressed();
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
            })
        };
        // Two forward passes' worth at once: the lane pauses before the first, the whole
        // MAX_YIELD, and then owes that long of running, so the second does not wait.
        let texts: Vec<String> = (0..2 * MAX_BATCH)
            .map(|i| format!("text {i} under pressure"))
            .collect();
        let vectors = embedder.embed_many(&texts).await.unwrap();
        assert_eq!(vectors.len(), texts.len());
        let paused = yielded(Lane::Bulk);
        assert!(
            paused >= MAX_YIELD && paused < MAX_YIELD * 2,
            "paused {paused:?} for two passes; expected one whole MAX_YIELD, and no more"
        );
        // Caught up (its queue found empty: give the thread a moment past its last answers),
        // it owes nothing, and the next text under the same pressure waits again.
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        embedder.embed("later, still under pressure").await.unwrap();
        assert!(yielded(Lane::Bulk) >= paused + MAX_YIELD);
        embedder.embed_query("a search").await.unwrap();
        assert_eq!(yielded(Lane::Query), std::time::Duration::ZERO);
        stop.store(true, Ordering::Relaxed);
        presser.join().unwrap();
    }
}

/// Niceness of the bulk lane's thread. Ingestion keeps one core busy for as long as memories are
/// queued; requests (acknowledging new memories, searches) and PostgreSQL then take the CPU
/// first, and the bulk lane loses only the time they use.
const BULK_NICE: i32 = 10;

/// Lowers the calling thread's scheduling priority to `BULK_NICE` (Linux: niceness is per
/// thread); elsewhere, or if refused, the thread keeps its priority.
fn lower_priority() {
    #[cfg(target_os = "linux")]
    // SAFETY: setpriority on the calling thread's own id; no memory is touched.
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, BULK_NICE);
    }
}
