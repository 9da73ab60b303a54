//! Seeded synthetic tasks (docs/training.md): copy, multi-query associative recall (MQAR) and
//! multi-hop recall, with disjoint train/test splits.
//!
//! Every example has the task's fixed length `T` (inputs) and one target per position
//! (`None` where there is no loss). The split is decided by a hash of the example's tokens:
//! an example whose hash falls in the test bucket is never drawn for training and vice versa,
//! so the test split holds only examples the model never trained on.

use mixer_core::{Error, Result};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

/// Which task.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskKind {
    /// `$ s | s .`: reproduce a random string after the separator.
    Copy,
    /// Key–value pairs, then queries of the keys at power-law gaps; predict each value.
    Mqar,
    /// Shuffled pairs `a b` forming chains; after `SEP`, follow a query's chain to its end.
    Multihop,
}

impl TaskKind {
    /// The lower-case name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            TaskKind::Copy => "copy",
            TaskKind::Mqar => "mqar",
            TaskKind::Multihop => "multihop",
        }
    }

    /// Parses `copy`, `mqar` or `multihop`.
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "copy" => Ok(TaskKind::Copy),
            "mqar" => Ok(TaskKind::Mqar),
            "multihop" | "multi-hop" => Ok(TaskKind::Multihop),
            _ => Err(Error::Io(format!("unknown task `{s}`; expected copy, mqar or multihop"))),
        }
    }
}

/// Train or test split.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    /// Examples whose hash is outside the test bucket.
    Train,
    /// Examples whose hash is in the test bucket (one in [`TEST_BUCKETS`]).
    Test,
}

/// One example in [`TEST_BUCKETS`] (by hash) belongs to the test split.
pub const TEST_BUCKETS: u64 = 8;

/// A task and its length settings. Fields that do not apply to the task are ignored.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TaskConfig {
    /// The task.
    pub task: TaskKind,
    /// copy: alphabet size (≤ 26); the vocabulary adds `$ | . *`.
    pub alphabet: usize,
    /// copy: shortest and longest string.
    pub min_len: usize,
    /// copy: longest string; the sequence length is `2·max_len + 2`.
    pub max_len: usize,
    /// mqar, multihop: vocabulary size (mqar: keys in `[1, V/2)`, values in `[V/2, V)`;
    /// multihop: symbols `0..V−1`, and `V − 1` is `SEP`).
    pub vocab: usize,
    /// mqar: number of key–value pairs `D`; multihop: number of pairs in the context.
    pub pairs: usize,
    /// mqar: sequence length `T` (≥ 4·D).
    pub seq_len: usize,
    /// mqar: power-law exponent `a` of the query gaps (Zoology's default 0.01).
    pub power_a: f64,
    /// multihop: longest chain (hops 1..=max_hops, uniformly).
    pub max_hops: usize,
    /// multihop: number of queried chains (queries after `SEP`).
    pub queries: usize,
}

impl Default for TaskConfig {
    fn default() -> Self {
        TaskConfig::new(TaskKind::Copy)
    }
}

/// One example: `tokens` (length `T`), `targets` (next token where there is a loss),
/// `groups` (multihop: the hop count of a labelled position; else 0).
#[derive(Clone, Debug, PartialEq)]
pub struct Example {
    /// Input tokens.
    pub tokens: Vec<usize>,
    /// Target per position, `None` where there is no loss.
    pub targets: Vec<Option<usize>>,
    /// Group of each labelled position (multihop: hop count).
    pub groups: Vec<usize>,
}

/// A batch of `n` examples of length `t`, row-major.
#[derive(Clone, Debug, PartialEq)]
pub struct Batch {
    /// Number of examples.
    pub n: usize,
    /// Sequence length.
    pub t: usize,
    /// `[n·t]` input tokens.
    pub tokens: Vec<usize>,
    /// `[n·t]` targets.
    pub targets: Vec<Option<usize>>,
    /// `[n·t]` groups.
    pub groups: Vec<usize>,
}

impl Batch {
    /// Stacks examples of one length.
    pub fn from_examples(ex: &[Example]) -> Self {
        let t = ex.first().map_or(0, |e| e.tokens.len());
        let mut b = Batch { n: ex.len(), t, tokens: Vec::new(), targets: Vec::new(), groups: Vec::new() };
        for e in ex {
            b.tokens.extend_from_slice(&e.tokens);
            b.targets.extend_from_slice(&e.targets);
            b.groups.extend_from_slice(&e.groups);
        }
        b
    }
}

fn hash(tokens: &[usize]) -> u64 {
    // FNV-1a over the tokens, then a final mix: stable across platforms and versions.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &t in tokens {
        h ^= t as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^ (h >> 33)
}

impl TaskConfig {
    /// The default setting of `task` (the small setting of `docs/training.md`).
    pub fn new(task: TaskKind) -> Self {
        let base = TaskConfig {
            task,
            alphabet: 8,
            min_len: 4,
            max_len: 10,
            vocab: 32,
            pairs: 6,
            seq_len: 32,
            power_a: 0.01,
            max_hops: 3,
            queries: 2,
        };
        match task {
            TaskKind::Copy | TaskKind::Mqar => base,
            TaskKind::Multihop => TaskConfig { vocab: 24, ..base },
        }
    }

    /// Checks the settings; every generator relies on them.
    pub fn validate(&self) -> Result<()> {
        let bad = |what: String| Err(Error::Io(format!("task {}: {what}", self.task.name())));
        match self.task {
            TaskKind::Copy => {
                if !(1..=26).contains(&self.alphabet) {
                    return bad(format!("alphabet must be in 1..=26, got {}", self.alphabet));
                }
                if self.min_len == 0 || self.min_len > self.max_len {
                    return bad(format!(
                        "need 1 ≤ min_len ≤ max_len, got {}..{}",
                        self.min_len, self.max_len
                    ));
                }
                if self.max_len > 4096 {
                    return bad(format!("max_len {} is above 4096", self.max_len));
                }
            }
            TaskKind::Mqar => {
                if self.vocab < 6 || self.vocab > 1 << 16 {
                    return bad(format!("vocab must be in 6..=65536, got {}", self.vocab));
                }
                let keys = self.vocab / 2 - 1;
                if self.pairs == 0 || self.pairs > keys {
                    return bad(format!(
                        "pairs must be in 1..={keys} (distinct keys in [1, V/2)), got {}",
                        self.pairs
                    ));
                }
                if self.seq_len < 4 * self.pairs || self.seq_len > 1 << 16 {
                    return bad(format!("seq_len must be in 4·pairs..=65536, got {}", self.seq_len));
                }
                if !(self.power_a > 0.0 && self.power_a <= 1.0) {
                    return bad(format!("power_a must be in (0, 1], got {}", self.power_a));
                }
            }
            TaskKind::Multihop => {
                if self.max_hops == 0 || self.queries == 0 {
                    return bad("max_hops and queries must be ≥ 1".into());
                }
                if self.pairs < self.queries * self.max_hops {
                    return bad(format!(
                        "pairs ({}) must be ≥ queries·max_hops ({})",
                        self.pairs,
                        self.queries * self.max_hops
                    ));
                }
                // Worst case: every pair in its own chain of one hop (2 symbols per pair).
                if self.vocab < 2 * self.pairs + 1 || self.vocab > 1 << 16 {
                    return bad(format!("vocab must be in 2·pairs+1..=65536, got {}", self.vocab));
                }
            }
        }
        Ok(())
    }

    /// Vocabulary size (number of token ids).
    pub fn vocab_size(&self) -> usize {
        match self.task {
            TaskKind::Copy => self.alphabet + 4,
            TaskKind::Mqar | TaskKind::Multihop => self.vocab,
        }
    }

    /// Input length `T` of every example.
    pub fn seq_len(&self) -> usize {
        match self.task {
            TaskKind::Copy => 2 * self.max_len + 2,
            TaskKind::Mqar => self.seq_len,
            TaskKind::Multihop => 2 * self.pairs + 1 + self.queries,
        }
    }

    /// Names of the groups of [`Example::groups`] (multihop: `1 hop`, `2 hops`, …).
    pub fn groups(&self) -> Vec<String> {
        match self.task {
            TaskKind::Multihop => {
                (1..=self.max_hops).map(|h| format!("{h} hop{}", if h == 1 { "" } else { "s" })).collect()
            }
            _ => vec!["all".into()],
        }
    }

    /// One example of `split`: drawn from `rng`, redrawn until its hash is in the split.
    pub fn sample(&self, rng: &mut StdRng, split: Split) -> Example {
        loop {
            let e = match self.task {
                TaskKind::Copy => self.copy(rng),
                TaskKind::Mqar => self.mqar(rng),
                TaskKind::Multihop => self.multihop(rng),
            };
            if hash(&e.tokens).is_multiple_of(TEST_BUCKETS) == (split == Split::Test) {
                return e;
            }
        }
    }

    /// `n` examples from a generator seeded with `seed` (the same seed gives the same batch).
    pub fn batch(&self, seed: u64, n: usize, split: Split) -> Result<Batch> {
        self.validate()?;
        let mut rng = StdRng::seed_from_u64(seed);
        let ex: Vec<Example> = (0..n).map(|_| self.sample(&mut rng, split)).collect();
        Ok(Batch::from_examples(&ex))
    }

    /// copy: `$ s | s .` then padding `*`; inputs are the sequence without its last token,
    /// targets the sequence shifted by one, with a loss on the copied `s` and the final `.`.
    fn copy(&self, rng: &mut StdRng) -> Example {
        let a = self.alphabet;
        let (dollar, bar, dot, pad) = (a, a + 1, a + 2, a + 3);
        let len = rng.random_range(self.min_len..=self.max_len);
        let s: Vec<usize> = (0..len).map(|_| rng.random_range(0..a)).collect();
        let t = self.seq_len();
        let mut seq = vec![dollar];
        seq.extend_from_slice(&s);
        seq.push(bar);
        let answer_start = seq.len();
        seq.extend_from_slice(&s);
        seq.push(dot);
        let answer_end = seq.len(); // exclusive
        seq.resize(t + 1, pad);
        let tokens = seq[..t].to_vec();
        let targets =
            (0..t).map(|i| (i + 1 >= answer_start && i + 1 < answer_end).then_some(seq[i + 1])).collect();
        Example { tokens, targets, groups: vec![0; t] }
    }

    /// MQAR (Zoology): `D` pairs `k v` (distinct keys in `[1, V/2)`, distinct values in `[V/2, V)`),
    /// then every key once more at a gap drawn with probability ∝ `i^(a−1)` among the query
    /// slots; the target at a queried key is its value, which the next input repeats. Token 0
    /// fills the rest.
    fn mqar(&self, rng: &mut StdRng) -> Example {
        let (v, d, t) = (self.vocab, self.pairs, self.seq_len);
        let mut keys: Vec<usize> = (1..v / 2).collect();
        keys.shuffle(rng);
        keys.truncate(d);
        // Distinct values, as Zoology draws them.
        let mut vals: Vec<usize> = (v / 2..v).collect();
        vals.shuffle(rng);
        vals.truncate(d);
        let mut tokens = vec![0usize; t];
        let mut targets = vec![None; t];
        for i in 0..d {
            tokens[2 * i] = keys[i];
            tokens[2 * i + 1] = vals[i];
        }
        // Query slots: positions 2D + 2j (j < space), each followed by its value.
        let space = (t - 2 * d) / 2;
        let mut weights: Vec<f64> = (1..=space).map(|i| (i as f64).powf(self.power_a - 1.0)).collect();
        let mut order: Vec<usize> = (0..d).collect();
        order.shuffle(rng);
        for &i in &order {
            // Draw a free slot without replacement.
            let total: f64 = weights.iter().sum();
            let mut r = rng.random::<f64>() * total;
            let mut j = 0;
            while j + 1 < space && (weights[j] == 0.0 || r >= weights[j]) {
                r -= weights[j];
                j += 1;
            }
            while weights[j] == 0.0 {
                j -= 1; // rounding at the end: take the last free slot
            }
            weights[j] = 0.0;
            let p = 2 * d + 2 * j;
            tokens[p] = keys[i];
            tokens[p + 1] = vals[i];
            targets[p] = Some(vals[i]);
        }
        Example { tokens, targets, groups: vec![0; t] }
    }

    /// Multi-hop recall: node-disjoint chains `x₀ → x₁ → … → x_h` over symbols `0..V−1`
    /// written as shuffled pairs `a b`; `queries` of them (hops uniform in `1..=max_hops`)
    /// are asked after `SEP` (`V − 1`) by their first symbol, with target `x_h`; the other
    /// pairs are distractor chains of the same kind.
    fn multihop(&self, rng: &mut StdRng) -> Example {
        let sep = self.vocab - 1;
        let mut symbols: Vec<usize> = (0..sep).collect();
        symbols.shuffle(rng);
        let mut next = symbols.into_iter();
        let mut chains: Vec<Vec<usize>> = Vec::new();
        let mut used = 0;
        for _ in 0..self.queries {
            let h = rng.random_range(1..=self.max_hops);
            chains.push((0..=h).map(|_| next.next().unwrap_or(0)).collect());
            used += h;
        }
        while used < self.pairs {
            let h = rng.random_range(1..=self.max_hops.min(self.pairs - used));
            chains.push((0..=h).map(|_| next.next().unwrap_or(0)).collect());
            used += h;
        }
        let mut pairs: Vec<(usize, usize)> =
            chains.iter().flat_map(|c| c.windows(2).map(|w| (w[0], w[1]))).collect();
        pairs.shuffle(rng);
        let t = self.seq_len();
        let mut tokens = Vec::with_capacity(t);
        for (a, b) in pairs {
            tokens.push(a);
            tokens.push(b);
        }
        tokens.push(sep);
        let mut targets = vec![None; t];
        let mut groups = vec![0; t];
        for c in &chains[..self.queries] {
            targets[tokens.len()] = c.last().copied();
            groups[tokens.len()] = c.len() - 2; // hop count − 1 indexes `groups()`
            tokens.push(c[0]);
        }
        Example { tokens, targets, groups }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all() -> Vec<TaskConfig> {
        vec![
            TaskConfig::new(TaskKind::Copy),
            TaskConfig::new(TaskKind::Mqar),
            TaskConfig::new(TaskKind::Multihop),
        ]
    }

    #[test]
    fn shapes_vocab_and_determinism() {
        for c in all() {
            let b = c.batch(7, 16, Split::Train).unwrap();
            assert_eq!(b.tokens.len(), 16 * c.seq_len());
            assert!(b.tokens.iter().all(|&x| x < c.vocab_size()));
            assert!(b.targets.iter().flatten().all(|&x| x < c.vocab_size()));
            assert!(b.targets.iter().any(Option::is_some));
            assert_eq!(b, c.batch(7, 16, Split::Train).unwrap());
            assert_ne!(b, c.batch(8, 16, Split::Train).unwrap());
        }
    }

    #[test]
    fn splits_are_disjoint() {
        for c in all() {
            let tr = c.batch(1, 200, Split::Train).unwrap();
            let te = c.batch(1, 200, Split::Test).unwrap();
            let t = c.seq_len();
            let train: std::collections::HashSet<&[usize]> = tr.tokens.chunks(t).collect();
            assert!(te.tokens.chunks(t).all(|e| !train.contains(e)), "{:?}", c.task);
            assert!(te.tokens.chunks(t).all(|e| hash(e).is_multiple_of(TEST_BUCKETS)));
        }
    }

    #[test]
    fn copy_layout() {
        let c = TaskConfig { min_len: 3, max_len: 3, alphabet: 4, ..TaskConfig::new(TaskKind::Copy) };
        let e = c.copy(&mut StdRng::seed_from_u64(3));
        // $ a b c | a b c .  (inputs drop the final token)
        assert_eq!(e.tokens.len(), 8);
        assert_eq!(e.tokens[0], 4);
        assert_eq!(e.tokens[4], 5);
        assert_eq!(&e.tokens[1..4], &e.tokens[5..8]);
        let labelled: Vec<usize> = (0..8).filter(|&i| e.targets[i].is_some()).collect();
        assert_eq!(labelled, vec![4, 5, 6, 7]);
        assert_eq!(e.targets[7], Some(6)); // `.`
    }

    #[test]
    fn mqar_queries_recall_their_values() {
        let c = TaskConfig::new(TaskKind::Mqar);
        let e = c.mqar(&mut StdRng::seed_from_u64(5));
        let kv: std::collections::HashMap<usize, usize> =
            (0..c.pairs).map(|i| (e.tokens[2 * i], e.tokens[2 * i + 1])).collect();
        assert_eq!(kv.len(), c.pairs);
        let values: std::collections::HashSet<usize> = kv.values().copied().collect();
        assert_eq!(values.len(), c.pairs, "values are distinct");
        assert!(values.iter().all(|&x| (c.vocab / 2..c.vocab).contains(&x)));
        let mut n = 0;
        for (p, t) in e.targets.iter().enumerate() {
            if let Some(v) = t {
                assert!(p >= 2 * c.pairs);
                assert_eq!(kv[&e.tokens[p]], *v);
                assert_eq!(e.tokens[p + 1], *v);
                n += 1;
            }
        }
        assert_eq!(n, c.pairs);
    }

    #[test]
    fn multihop_follows_chains() {
        let c = TaskConfig::new(TaskKind::Multihop);
        for seed in 0..20 {
            let e = c.multihop(&mut StdRng::seed_from_u64(seed));
            let sep = e.tokens.iter().position(|&x| x == c.vocab - 1).unwrap();
            assert_eq!(sep, 2 * c.pairs);
            let next: std::collections::HashMap<usize, usize> =
                (0..c.pairs).map(|i| (e.tokens[2 * i], e.tokens[2 * i + 1])).collect();
            assert_eq!(next.len(), c.pairs, "sources are distinct");
            for p in sep + 1..e.tokens.len() {
                let (mut x, mut hops) = (e.tokens[p], 0);
                while let Some(&y) = next.get(&x) {
                    x = y;
                    hops += 1;
                }
                assert_eq!(Some(x), e.targets[p]);
                assert_eq!(hops, e.groups[p] + 1);
            }
        }
    }

    #[test]
    fn bad_settings_are_errors() {
        let c = TaskConfig { alphabet: 30, ..TaskConfig::new(TaskKind::Copy) };
        assert!(c.batch(0, 1, Split::Train).is_err());
        let c = TaskConfig { seq_len: 10, ..TaskConfig::new(TaskKind::Mqar) };
        assert!(c.batch(0, 1, Split::Train).is_err());
        let c = TaskConfig { vocab: 5, ..TaskConfig::new(TaskKind::Multihop) };
        assert!(c.batch(0, 1, Split::Train).is_err());
    }
}
