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

/// Cues of what a person would need to recall, by kind. A cue is words in a row; a word ending
/// in `*` matches every word it begins, the others match themselves or with `s`/`es`. An
/// appointment counts only with a when (a number, a weekday, a month…).
const VITAL: [(&str, &[&str]); 5] = [
    (
        "health",
        &[
            "allerg*",
            "anaphyla*",
            "epipen",
            "medication*",
            "medicine",
            "pill",
            "dose",
            "mg",
            "insulin",
            "diabet*",
            "epilep*",
            "seizure",
            "asthma",
            "inhaler",
            "blood type",
            "surgery",
            "dementia",
            "celiac",
            "coeliac",
            "gluten",
            "warfarin",
            "prescription*",
            "hospital",
            "doctor",
            "dentist",
            "hives",
            "intoleran*",
            "can't eat",
            "cannot eat",
            "aspirin",
            "heart condition",
            "pregnan*",
        ],
    ),
    (
        "safety",
        &[
            "never",
            "emergency",
            "urgent",
            "critical",
            "important",
            "don't forget",
            "do not forget",
            "remember to",
            "must",
            "has to",
            "have to",
            "needs to",
            "need to",
            "required",
        ],
    ),
    (
        "access",
        &[
            "password",
            "passcode",
            "pin",
            "code is",
            "gate code",
            "alarm code",
            "door code",
            "spare key",
            "login",
            "token",
            "vault",
            "2fa",
            "yubikey",
            "vpn",
            "combination",
            "account number",
            "username",
            "ssn",
            "social security",
        ],
    ),
    (
        "obligation",
        &[
            "deadline",
            "due",
            "expir*",
            "renewal",
            "renew*",
            "notice",
            "contract",
            "lease",
            "sign",
            "promis*",
            "agreed to",
            "commit*",
            "owe",
            "payment",
            "rent",
            "bill",
            "tax",
            "invoice",
            "insurance",
            "claim",
        ],
    ),
    (
        "appointment",
        &[
            "appointment",
            "flight",
            "interview",
            "meeting at",
            "passport",
            "visa",
            "booking",
            "reservation",
            "check-in",
        ],
    ),
];
/// Words that soften a vital cue ("allergic, but only mildly").
const HEDGES: &[&str] = &["mild*", "slightly", "a little", "a bit", "not serious"];
/// Facts about a person, preferences, habits and plans: worth keeping, rarely vital.
const USEFUL: &[&str] = &[
    "prefer*",
    "favourit*",
    "favorit*",
    "likes",
    "like to",
    "hates",
    "works",
    "job",
    "lives",
    "moved",
    "studying",
    "learning",
    "speaks",
    "usually",
    "every day",
    "every week",
    "every morning",
    "every evening",
    "every night",
    "every weekend",
    "each week",
    "getting married",
    "planning",
    "my sister",
    "my brother",
    "my partner",
    "my son",
    "my daughter",
    "my mum",
    "my mom",
    "my dad",
    "my wife",
    "my husband",
    "my manager",
    "my boss",
    "friend",
    "vegetarian",
    "vegan",
    "allergic",
];
/// Small-talk markers.
const IDLE: &[&str] = &[
    "lol",
    "haha",
    "hehe",
    "lmao",
    "omg",
    "bored",
    "nothing much",
    "nothing special",
    "random",
    "anyway",
    "weather",
    "kind of",
    "sort of",
    "i guess",
    "honestly",
    "for no reason",
    "no real reason",
    "doesn't matter",
    "not important",
    "whatever",
    "funny",
    "silly",
    "chatt*",
    "scroll*",
    "brows*",
    "idly",
    "wonder*",
    "hmm",
    "ugh",
];
/// Words a message made only of (five at most) is chit-chat.
const CHIT_CHAT: &[&str] = &[
    "ok", "okay", "thanks", "thank", "you", "lol", "hi", "hello", "hey", "cool", "nice", "sure",
    "yes", "no", "great", "bye", "k", "thx", "ty", "same", "haha", "sounds", "good",
];
const WHEN: &[&str] = &[
    "monday",
    "tuesday",
    "wednesday",
    "thursday",
    "friday",
    "saturday",
    "sunday",
    "tomorrow",
    "tonight",
    "noon",
    "midnight",
    "week",
    "month",
];

fn word_matches(word: &str, cue: &str) -> bool {
    match cue.strip_suffix('*') {
        Some(prefix) => word.starts_with(prefix),
        None => {
            word == cue
                || word
                    .strip_prefix(cue)
                    .is_some_and(|rest| rest == "s" || rest == "es")
        }
    }
}

/// Whether any of `cues` occurs in `words` (see [`VITAL`] for how a cue matches).
fn has_cue(words: &[String], cues: &[&str]) -> bool {
    cues.iter().any(|cue| {
        let parts: Vec<&str> = cue.split(' ').collect();
        words
            .windows(parts.len())
            .any(|w| w.iter().zip(&parts).all(|(w, c)| word_matches(w, c)))
    })
}

/// `importance_score` in [0, 1]: what a person would need to recall, whatever the length.
/// From 0.5:
/// - **vital** (+0.3, +0.05 for each further kind, at most three kinds): health and safety
///   (an allergy, a medication, "never"), access details (a password, a code, a key's place),
///   obligations and deadlines (due, expires, promised, rent), appointments with a when;
///   −0.15 when hedged ("only mildly");
/// - **useful** (+0.1): a fact about a person, a preference, a habit, a plan;
/// - **idle** (−0.1 per small-talk marker, at most two: "lol", "anyway", "the weather"…);
///   −0.3 for a message of at most five chit-chat words ("ok thanks"); −0.1 for a long text
///   (over 25 words) with no vital or useful cue: length without substance;
/// - **specific** (+0.05): it carries a number;
/// - **novelty** against the account's memories (`max_similarity`, the cosine to the closest):
///   a near-duplicate (over 0.95) loses 0.15, otherwise up to +0.1 for a new topic.
///
/// The weights were chosen on the `dev` half of `data/importance/rated.tsv` (108 memories rated
/// 1–3, half short-but-vital or long-but-idle) and are reported on its `held` half by
/// `engram bench importance`. The sector does not enter: a vital fact is vital in any sector.
pub fn importance(_sector: usize, text: &str, max_similarity: Option<f32>) -> f32 {
    let ws = words(text);
    let mut score = 0.5;
    let kinds = VITAL
        .iter()
        .filter(|(kind, cues)| {
            has_cue(&ws, cues)
                && (*kind != "appointment"
                    || text.chars().any(|c| c.is_ascii_digit())
                    || has_cue(&ws, WHEN)
                    || has_cue(&ws, &super::dates::MONTHS))
        })
        .count();
    if kinds > 0 {
        score += 0.3 + 0.05 * (kinds.min(3) - 1) as f32;
    }
    if has_cue(&ws, HEDGES) {
        score -= 0.15;
    }
    let useful = has_cue(&ws, USEFUL);
    if useful {
        score += 0.1;
    }
    let idle = IDLE.iter().filter(|cue| has_cue(&ws, &[**cue])).count();
    score -= 0.1 * idle.min(2) as f32;
    if ws.len() <= 5 && ws.iter().all(|w| CHIT_CHAT.contains(&w.as_str())) {
        score -= 0.3;
    }
    if ws.len() > 25 && kinds == 0 && !useful {
        score -= 0.1;
    }
    if text.chars().any(|c| c.is_ascii_digit()) {
        score += 0.05;
    }
    match max_similarity {
        Some(sim) if sim > 0.95 => score -= 0.15,
        Some(sim) => score += 0.1 * (1.0 - sim.max(0.0)),
        None => score += 0.1,
    }
    score.clamp(0.0, 1.0)
}

/// The rated set: (rating 1–3, held out, kind, text).
pub const IMPORTANCE_TSV: &str = include_str!("../../data/importance/rated.tsv");

pub fn rated_importance() -> Vec<(u8, bool, String, String)> {
    IMPORTANCE_TSV
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .filter_map(|l| {
            let mut f = l.splitn(4, '\t');
            let rating = f.next()?.parse().ok()?;
            let held = f.next()? == "held";
            Some((rating, held, f.next()?.to_string(), f.next()?.to_string()))
        })
        .collect()
}

/// Spearman's rank correlation (ties get their mean rank).
pub fn spearman(a: &[f64], b: &[f64]) -> f64 {
    fn ranks(v: &[f64]) -> Vec<f64> {
        let mut idx: Vec<usize> = (0..v.len()).collect();
        idx.sort_by(|&i, &j| v[i].total_cmp(&v[j]));
        let mut r = vec![0.0; v.len()];
        let mut i = 0;
        while i < idx.len() {
            let mut j = i;
            while j + 1 < idx.len() && v[idx[j + 1]] == v[idx[i]] {
                j += 1;
            }
            for k in i..=j {
                r[idx[k]] = (i + j) as f64 / 2.0 + 1.0;
            }
            i = j + 1;
        }
        r
    }
    let (ra, rb) = (ranks(a), ranks(b));
    let n = ra.len() as f64;
    let (ma, mb) = (ra.iter().sum::<f64>() / n, rb.iter().sum::<f64>() / n);
    let cov: f64 = ra.iter().zip(&rb).map(|(x, y)| (x - ma) * (y - mb)).sum();
    let va: f64 = ra.iter().map(|x| (x - ma).powi(2)).sum::<f64>().sqrt();
    let vb: f64 = rb.iter().map(|y| (y - mb).powi(2)).sum::<f64>().sqrt();
    if va == 0.0 || vb == 0.0 {
        return 0.0;
    }
    cov / (va * vb)
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
    fn short_vital_memories_outrank_long_idle_ones() {
        let vital = importance(1, "Wifi password: otter-harbor-42", None);
        let idle = importance(
            0,
            "We talked for ages about which sandwich place is best, went through every option, \
             argued about bread for a while, and in the end nobody really cared which one won",
            None,
        );
        let hedged = importance(1, "I'm mildly allergic to dust", None);
        let allergy = importance(1, "Mia is allergic to peanuts.", None);
        let useful = importance(1, "My manager Helen prefers updates by email", None);
        assert!(
            vital > 0.8 && idle <= 0.5 && useful > idle,
            "{vital} {idle} {useful}"
        );
        assert!(allergy > hedged, "{allergy} {hedged}");
        // A bill is an obligation; billing is not.
        assert!(
            importance(1, "Pay the water bill on Friday", None)
                > importance(1, "Chris knows the billing system", None)
        );
    }

    #[test]
    fn spearman_ranks_with_ties() {
        assert!((spearman(&[1.0, 2.0, 3.0], &[0.1, 0.5, 0.9]) - 1.0).abs() < 1e-9);
        assert!((spearman(&[1.0, 2.0, 3.0], &[0.9, 0.5, 0.1]) + 1.0).abs() < 1e-9);
        let r = spearman(&[1.0, 1.0, 3.0, 3.0], &[0.2, 0.3, 0.6, 0.5]);
        assert!((r - 0.894_427).abs() < 1e-5, "{r}");
    }

    /// The rated set's held-out half (weights were chosen on the other): a regression guard
    /// for `bench importance`'s figure.
    #[test]
    fn importance_ranks_the_held_out_rated_memories_like_people() {
        let rows = rated_importance();
        assert!(rows.len() >= 80);
        let held: Vec<_> = rows.iter().filter(|r| r.1).collect();
        let ratings: Vec<f64> = held.iter().map(|r| f64::from(r.0)).collect();
        let scores: Vec<f64> = held
            .iter()
            .map(|r| f64::from(importance(1, &r.3, None)))
            .collect();
        let rho = spearman(&ratings, &scores);
        assert!(rho >= 0.80, "held-out Spearman {rho:.3}");
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
