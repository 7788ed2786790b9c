//! The local classifier: nearest sector centroid of the MiniLM embeddings (learned from
//! `data/classifier/`), plus a small fixed bonus for textual cues. The cues are added to the
//! similarity, not learned as features, so implicit phrasing still goes by meaning.
//! Importance comes from transparent signals, each a term of `importance`.
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::embed::{cosine, EmbedderHandle, DIM, MODEL_NAME};

/// The five cognitive sectors, in a fixed order.
pub const SECTORS: [&str; 5] = [
    "episodic",
    "semantic",
    "procedural",
    "emotional",
    "reflective",
];

/// How much one sector's cues add to its similarity.
const CUE_BONUS: f32 = 0.04;

/// The labelled data the centroids learn from.
pub const TRAIN_TSV: &str = include_str!("../../data/classifier/train.tsv");
pub const PROTOS_TSV: &str = include_str!("../../data/classifier/protos.tsv");

/// `(sector index, text)` rows of a `sector<TAB>text` file.
pub fn parse_tsv(tsv: &str) -> Vec<(usize, String)> {
    tsv.lines()
        .filter_map(|line| {
            let (sector, text) = line.split_once('\t')?;
            let idx = SECTORS.iter().position(|s| *s == sector.trim())?;
            Some((idx, text.trim().to_string()))
        })
        .collect()
}

/// One L2-normalised mean vector per sector.
#[derive(Clone, Serialize, Deserialize)]
pub struct Centroids {
    pub model: String,
    pub vectors: Vec<Vec<f32>>,
}

impl Centroids {
    /// Averages the embeddings of each sector's examples.
    pub fn fit(examples: &[(usize, Vec<f32>)]) -> Self {
        let mut sums = vec![vec![0f32; DIM]; SECTORS.len()];
        for (sector, v) in examples {
            for (s, x) in sums[*sector].iter_mut().zip(v) {
                *s += x;
            }
        }
        for s in &mut sums {
            let norm = s.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
            s.iter_mut().for_each(|x| *x /= norm);
        }
        Self {
            model: MODEL_NAME.into(),
            vectors: sums,
        }
    }

    /// The sector of a text: highest similarity to a centroid plus the cue bonus.
    pub fn classify(&self, embedding: &[f32], text: &str) -> usize {
        let cues = cue_scores(text);
        (0..SECTORS.len())
            .map(|i| (i, cosine(&self.vectors[i], embedding) + CUE_BONUS * cues[i]))
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(i, _)| i)
            .unwrap_or(1)
    }

    /// Loads the centroids cached beside the model, or fits and caches them.
    pub async fn load_or_fit(embedder: &EmbedderHandle) -> anyhow::Result<Self> {
        let cache = embedder.dir().join("engram-centroids-v1.json");
        if let Some(c) = read_cache(&cache) {
            return Ok(c);
        }
        let mut rows = parse_tsv(TRAIN_TSV);
        rows.extend(parse_tsv(PROTOS_TSV));
        let texts: Vec<String> = rows.iter().map(|(_, t)| t.clone()).collect();
        let vectors = embedder.embed_many(&texts).await?;
        let examples: Vec<(usize, Vec<f32>)> = rows.iter().map(|(s, _)| *s).zip(vectors).collect();
        let centroids = Self::fit(&examples);
        let tmp = cache.with_extension(format!("tmp{}", std::process::id()));
        if std::fs::write(&tmp, serde_json::to_vec(&centroids)?).is_ok() {
            let _ = std::fs::rename(&tmp, &cache);
        }
        Ok(centroids)
    }
}

fn read_cache(path: &Path) -> Option<Centroids> {
    let c: Centroids = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    (c.model == MODEL_NAME && c.vectors.len() == SECTORS.len()).then_some(c)
}

fn words(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric() && c != '\'')
        .filter(|w| !w.is_empty())
        .map(|w| w.to_lowercase())
        .collect()
}

fn has_phrase(lower: &str, phrases: &[&str]) -> bool {
    phrases.iter().any(|p| lower.contains(p))
}

/// 0 or 1 per sector: whether the text carries that sector's surface cues.
pub fn cue_scores(text: &str) -> [f32; 5] {
    let lower = format!(" {} ", text.to_lowercase());
    let ws = words(text);
    let any_word = |list: &[&str]| ws.iter().any(|w| list.contains(&w.as_str()));
    let episodic = has_phrase(
        &lower,
        &[
            " yesterday",
            " last week",
            " last month",
            " last year",
            " this morning",
            " tonight",
            " last night",
            " ago ",
            " ago.",
            " on monday",
            " on tuesday",
            " on wednesday",
            " on thursday",
            " on friday",
            " on saturday",
            " on sunday",
            " last friday",
            " earlier today",
        ],
    );
    let first = ws.first().map(String::as_str).unwrap_or_default();
    let imperative = [
        "run",
        "use",
        "install",
        "open",
        "click",
        "set",
        "add",
        "create",
        "restart",
        "press",
        "type",
        "select",
        "configure",
        "to",
        "first",
        "always",
        "never",
    ]
    .contains(&first);
    let procedural = imperative
        || has_phrase(
            &lower,
            &[
                " step ",
                " steps",
                "how to",
                " then ",
                " first,",
                " first ",
                " next,",
                " finally,",
                " make sure",
            ],
        );
    let emotional = any_word(&[
        "love",
        "loves",
        "hate",
        "hates",
        "feel",
        "feels",
        "felt",
        "happy",
        "sad",
        "angry",
        "anxious",
        "afraid",
        "excited",
        "frustrated",
        "prefer",
        "prefers",
        "enjoy",
        "enjoys",
        "dislike",
        "upset",
        "worried",
        "proud",
        "lonely",
        "annoyed",
    ]);
    let reflective = has_phrase(
        &lower,
        &[
            "looking back",
            "in hindsight",
            "i realized",
            "i realised",
            "i've learned",
            "i have learned",
            "lesson",
            "overall",
            "in retrospect",
            "the pattern",
            "i notice",
            "on reflection",
            "takeaway",
        ],
    );
    [
        episodic as u8 as f32,
        0.0,
        procedural as u8 as f32,
        emotional as u8 as f32,
        reflective as u8 as f32,
    ]
}

/// `importance_score` in [0, 1], the sum of:
/// - a sector prior (procedural and reflective knowledge tends to be reused, chit-chat not);
/// - specificity: names, numbers and dates, 0.05 each, at most 0.15;
/// - explicit salience ("remember", "allergic", "deadline", "never", …): +0.2;
/// - a chit-chat penalty ("ok thanks", very short texts): −0.3;
/// - novelty against the account's existing memories: `max_similarity` is the cosine to the
///   closest one; a near-duplicate loses 0.15, a new topic gains up to 0.1.
pub fn importance(sector: usize, text: &str, max_similarity: Option<f32>) -> f32 {
    const PRIOR: [f32; 5] = [0.45, 0.5, 0.55, 0.5, 0.55];
    let mut score = PRIOR[sector];
    let ws = words(text);
    let raw_words: Vec<&str> = text.split_whitespace().collect();
    let names = raw_words
        .iter()
        .skip(1)
        .filter(|w| w.chars().next().is_some_and(|c| c.is_uppercase()))
        .count();
    let numbers = raw_words
        .iter()
        .filter(|w| w.chars().any(|c| c.is_ascii_digit()))
        .count();
    let months = ws
        .iter()
        .filter(|w| {
            [
                "january",
                "february",
                "march",
                "april",
                "may",
                "june",
                "july",
                "august",
                "september",
                "october",
                "november",
                "december",
                "monday",
                "tuesday",
                "wednesday",
                "thursday",
                "friday",
                "saturday",
                "sunday",
            ]
            .contains(&w.as_str())
        })
        .count();
    score += (0.05 * (names.min(2) + numbers.min(2) + months.min(1)) as f32).min(0.15);
    let salient = [
        "remember",
        "important",
        "allergic",
        "allergy",
        "deadline",
        "never",
        "always",
        "must",
        "critical",
        "urgent",
        "password",
        "birthday",
        "anniversary",
        "don't forget",
        "do not forget",
    ];
    let lower = text.to_lowercase();
    if salient.iter().any(|s| lower.contains(s)) {
        score += 0.2;
    }
    let chit_chat = [
        "ok", "okay", "thanks", "thank", "you", "lol", "hi", "hello", "hey", "cool", "nice",
        "sure", "yes", "no", "great", "bye", "k", "thx", "ty",
    ];
    if ws.len() <= 2 || (ws.len() <= 5 && ws.iter().all(|w| chit_chat.contains(&w.as_str()))) {
        score -= 0.3;
    }
    match max_similarity {
        Some(sim) if sim > 0.95 => score -= 0.15,
        Some(sim) => score += 0.1 * (1.0 - sim.max(0.0)),
        None => score += 0.1,
    }
    score.clamp(0.0, 1.0)
}

/// Held-out accuracy: every fifth example of each sector is held out, the centroids learn from
/// the rest (and the prototypes), and the held-out rows are classified. Returns (correct, total).
pub async fn held_out_accuracy(
    embedder: &EmbedderHandle,
) -> anyhow::Result<(usize, usize, Vec<[usize; 5]>)> {
    let train = parse_tsv(TRAIN_TSV);
    let protos = parse_tsv(PROTOS_TSV);
    let mut seen = [0usize; 5];
    let (mut fit_rows, mut test_rows) = (protos, vec![]);
    for (sector, text) in train {
        seen[sector] += 1;
        if seen[sector] % 5 == 0 {
            test_rows.push((sector, text));
        } else {
            fit_rows.push((sector, text));
        }
    }
    let embed = |rows: &[(usize, String)]| rows.iter().map(|(_, t)| t.clone()).collect::<Vec<_>>();
    let fit_vecs = embedder.embed_many(&embed(&fit_rows)).await?;
    let test_vecs = embedder.embed_many(&embed(&test_rows)).await?;
    let centroids = Centroids::fit(
        &fit_rows
            .iter()
            .map(|(s, _)| *s)
            .zip(fit_vecs)
            .collect::<Vec<_>>(),
    );
    let mut confusion = vec![[0usize; 5]; 5];
    let mut correct = 0;
    for ((sector, text), v) in test_rows.iter().zip(&test_vecs) {
        let predicted = centroids.classify(v, text);
        confusion[*sector][predicted] += 1;
        correct += (predicted == *sector) as usize;
    }
    Ok((correct, test_rows.len(), confusion))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn training_files_cover_every_sector() {
        let rows = parse_tsv(TRAIN_TSV);
        assert_eq!(rows.len(), 200);
        for s in 0..5 {
            assert_eq!(rows.iter().filter(|(x, _)| *x == s).count(), 40);
        }
    }

    #[test]
    fn importance_rewards_salience_and_punishes_chit_chat() {
        let allergy = importance(1, "Remember: Sam is allergic to peanuts since 2019", None);
        let thanks = importance(3, "ok thanks", None);
        let plain = importance(1, "the office has a coffee machine", Some(0.5));
        assert!(
            allergy > plain && plain > thanks,
            "{allergy} {plain} {thanks}"
        );
        assert!((0.0..=1.0).contains(&allergy) && (0.0..=1.0).contains(&thanks));
        assert!(importance(1, "the office has a coffee machine", Some(0.99)) < plain);
    }

    #[test]
    fn cues_mark_time_steps_feelings_and_hindsight() {
        assert_eq!(cue_scores("Yesterday I met Ann")[0], 1.0);
        assert_eq!(cue_scores("Run cargo build, then restart")[2], 1.0);
        assert_eq!(cue_scores("I love hiking")[3], 1.0);
        assert_eq!(
            cue_scores("Looking back, the rewrite was a mistake")[4],
            1.0
        );
    }

    #[tokio::test]
    async fn held_out_accuracy_is_well_above_chance() {
        let embedder = EmbedderHandle::new(super::super::embed::default_model_dir());
        let (correct, total, _) = held_out_accuracy(&embedder).await.unwrap();
        assert_eq!(total, 40);
        // Chance is 20 %; the centroid classifier must be far better than that.
        assert!(
            correct * 100 / total >= 70,
            "held-out accuracy {correct}/{total}"
        );
    }
}
