//! Which split each `tokenizer.ggml.pre` name selects, and the compiled split plan a
//! byte-level BPE model runs.
//!
//! The table mirrors the reference's vocabulary loader (`src/llama-vocab.cpp`): a name maps
//! to a pre-tokenizer type, and the type to an ordered list of patterns, each splitting the
//! pieces the one before left. Where nx has a hand-written splitter equivalent to a whole
//! list (and proven on the reference's test vectors), the row names it; every other row
//! lists the reference's patterns. A pattern the reference itself intercepts with a custom
//! splitter (GPT-2's, Llama 3's, Qwen2's, Qwen3.5's, Kimi-K2's, newline runs, AFMoE digits)
//! runs nx's hand-written twin of that splitter; any other pattern runs the backtracking
//! engine of `regex.rs`, which reproduces the reference's `std::regex` over
//! category-collapsed text.

use crate::pretok::{PreTokenizer, PreTokenizerConfig, SplitScratch};
use crate::regex::{split_with, RefRegex};
use crate::TokenizerError;

const fn row(
    name: &'static str,
    pre: PreTokenizer,
    ignore_merges: bool,
    add_bos_default: bool,
) -> PreTokenizerConfig {
    PreTokenizerConfig {
        name,
        pre,
        patterns: &[],
        ignore_merges,
        add_bos_default,
        raw_utf8: false,
    }
}

const fn pats(
    name: &'static str,
    patterns: &'static [&'static str],
    ignore_merges: bool,
    add_bos_default: bool,
) -> PreTokenizerConfig {
    PreTokenizerConfig {
        name,
        pre: PreTokenizer::Patterns,
        patterns,
        ignore_merges,
        add_bos_default,
        raw_utf8: false,
    }
}

const fn raw(name: &'static str) -> PreTokenizerConfig {
    PreTokenizerConfig {
        name,
        pre: PreTokenizer::Patterns,
        patterns: NEWLINES,
        ignore_merges: false,
        add_bos_default: true,
        raw_utf8: true,
    }
}

// The reference's patterns, as its source writes them (C and Rust string escapes agree).
const GPT2_PATTERN: &str =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";
const LLAMA3_PATTERN: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const LLAMA3_PATTERN_CI: &str = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const QWEN2_PATTERN: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const QWEN35_PATTERN: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const NEWLINES_PATTERN: &str = "[^\\n]+|[\\n]+";
const AFMOE_DIGITS_PATTERN: &str = "\\p{AFMoE_digits}";
const TINY_AYA_DIGITS_PATTERN: &str = "\\d{1,3}(?=(?:\\d{3})*\\b)";
/// The reference's trigger for its Kimi-K2 splitter, which stands for the whole pattern.
const KIMI_K2_PATTERN: &str = "\\p{Han}+";

const NEWLINES: &[&str] = &[NEWLINES_PATTERN];

const JAIS2: &[&str] = &["(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s{512}(?!\\S)|\\s{256}(?!\\S)|\\s{128}(?!\\S)|\\s{64}(?!\\S)|\\s{32}(?!\\S)|\\s{16}(?!\\S)|\\s{8}(?!\\S)|\\s{4}(?!\\S)|\\s{1,2}(?!\\S)|\\s{1}"];
const DEEPSEEK3: &[&str] = &[
    "\\p{N}{1,3}",
    "[一-龥぀-ゟ゠-ヿ]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
];
const SPARK2_5: &[&str] = &[
    "\\p{N}{1,3}",
    "[一-龥぀-ゟ゠-ヿ]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+|[\r\n]|\\s+(?!\\S)|\\s+",
    "\\p{N}",
];
const YOUTU: &[&str] = &[
    "[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥぀-ゟ゠-ヿ]+",
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
const PORO: &[&str] = &[" ?[^(\\s|.,!?…。，、।۔،)]+"];
const VIKING: &[&str] = &[" ?[^(\\s|.,!?…。，、।۔،)]+", "\\p{N}"];
const TEKKEN: &[&str] = &["[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"];
const CHAMELEON: &[&str] = &[
    "<sentinel:[0-9]+>",
    "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
    "([\\t\\n]|    |  )",
    "\\p{N}",
    "[\\p{P}!-/:-@\\[-`{-~]",
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
];
const GPT4O: &[&str] = &["[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"];
const GRANITE_EMB_MULTI: &[&str] = &["[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))*((?=[\\p{L}\\p{M}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))+((?=[\\p{L}\\p{M}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"];
const TINY_AYA: &[&str] = &[
    TINY_AYA_DIGITS_PATTERN,
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
const SUPERBPE: &[&str] = &["\\p{N}+", "(?=(\\d{3})+(?!\\d))"];
const BAILINGMOE: &[&str] = &["'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+"];
const SEED_CODER: &[&str] = &["(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"];
const UFAKZEKA: &[&str] = &["[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"];
const AFMOE: &[&str] = &[
    AFMOE_DIGITS_PATTERN,
    "[一-鿿㐀-䶿豈-﫿぀-ゟ゠-ヿ･-ﾟ⼀-⿟เ-๿຀-໿ក-៿က-႟ꩠ-ꩿꧠ-꧿가-힯ᄀ-ᇿ]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
const LAGUNA: &[&str] = &[NEWLINES_PATTERN, QWEN2_PATTERN];
const EXAONE_MOE: &[&str] = &["(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?(?:\\p{L}\\p{M}*(?: \\p{L}\\p{M}*)*)+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]?|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+"];
const MINICPM5: &[&str] = &[
    "\\p{N}{1,3}",
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}+| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];

use PreTokenizer as P;

/// Every `tokenizer.ggml.pre` name nx reads, with what the reference's vocabulary loader
/// selects for it: the split, `ignore_merges`, whether BOS is added by default, and the
/// SentencePiece-style variant. Names whose tokenizer needs steps nx does not have (a
/// separator token after the text, a lower-casing normalizer, Metaspace word splitting)
/// are absent and stay a clear error.
pub const NAMES: &[PreTokenizerConfig] = &[
    row("default", P::Default, false, false),
    row("llama3", P::Llama3, true, true),
    row("llama-v3", P::Llama3, true, true),
    row("llama-bpe", P::Llama3, true, true),
    row("falcon3", P::Llama3, true, true),
    row("falcon-h1", P::Llama3, true, true),
    row("pixtral", P::Llama3, true, true),
    row("midm-2.0", P::Llama3, true, true),
    row("lfm2", P::Llama3, true, true),
    row("jina-v5-nano", P::Llama3, true, true),
    row("dbrx", P::Llama3, false, false),
    row("smaug-bpe", P::Llama3, false, false),
    row("chatglm-bpe", P::Llama3, false, false),
    row("glm4", P::Llama3, true, false),
    row("glm5", P::Llama3, true, false),
    pats("minicpm5", MINICPM5, true, false),
    pats("jais-2", JAIS2, false, false),
    row("deepseek-llm", P::DeepseekLlm, false, false),
    row("deepseek-coder", P::DeepseekCoder, false, false),
    pats("deepseek-v3", DEEPSEEK3, false, false),
    pats("hunyuan-dense", DEEPSEEK3, false, false),
    pats("joyai-llm", DEEPSEEK3, false, false),
    pats("hy_v4", DEEPSEEK3, false, false),
    pats("spark2_5", SPARK2_5, false, false),
    pats("youtu", YOUTU, true, false),
    row("falcon", P::Falcon, false, false),
    row("gpt-2", P::Gpt2, false, false),
    row("phi-2", P::Gpt2, false, false),
    row("jina-es", P::Gpt2, false, false),
    row("jina-de", P::Gpt2, false, false),
    row("gigachat", P::Gpt2, false, false),
    row("jina-v2-es", P::Gpt2, false, false),
    row("jina-v2-de", P::Gpt2, false, false),
    row("a.x-4.0", P::Gpt2, false, false),
    row("mellum", P::Gpt2, false, false),
    row("modern-bert", P::Gpt2, false, false),
    row("exaone4", P::Gpt2, false, false),
    row("mpt", P::Gpt2, false, false),
    row("olmo", P::Gpt2, false, false),
    row("jais", P::Gpt2, false, false),
    row("trillion", P::Gpt2, false, false),
    row("granite-docling", P::Gpt2, false, false),
    row("starcoder", P::DigitsThenGpt2, false, false),
    row("refact", P::DigitsThenGpt2, false, false),
    row("command-r", P::DigitsThenGpt2, false, false),
    row("smollm", P::DigitsThenGpt2, false, false),
    row("codeshell", P::DigitsThenGpt2, false, false),
    row("exaone", P::DigitsThenGpt2, false, false),
    row("minerva-7b", P::DigitsThenGpt2, false, false),
    row("mellum2", P::DigitsThenGpt2, false, false),
    row("qwen2", P::Qwen2, false, false),
    row("deepseek-r1-qwen", P::Qwen2, false, false),
    row("kormo", P::Qwen2, false, false),
    row("f2llmv2", P::Qwen2, false, false),
    row("megrez", P::Qwen2, false, false),
    row("stablelm2", P::Qwen2, false, false),
    row("hunyuan", P::Qwen2, false, false),
    row("solar-open", P::Qwen2, false, false),
    row("grok-2", P::Qwen2, false, false),
    row("qwen35", P::Qwen35, false, false),
    pats("poro-chat", PORO, false, false),
    pats("bloom", PORO, false, false),
    pats("gpt3-finnish", PORO, false, false),
    pats("viking", VIKING, false, false),
    pats("tekken", TEKKEN, true, true),
    pats("chameleon", CHAMELEON, false, true),
    pats("exaone-moe", EXAONE_MOE, false, false),
    pats("gpt-4o", GPT4O, false, false),
    pats("llama4", GPT4O, false, false),
    pats("kanana2", GPT4O, false, false),
    pats("talkie", GPT4O, false, false),
    pats("minimax-m2", GPT4O, false, false),
    pats("granite-embed-multi-97m", GRANITE_EMB_MULTI, true, false),
    pats("tiny_aya", TINY_AYA, false, false),
    pats("cohere2moe", TINY_AYA, false, false),
    pats("superbpe", SUPERBPE, false, false),
    pats("bailingmoe", BAILINGMOE, false, false),
    pats("bailingmoe2", BAILINGMOE, false, false),
    pats("llada-moe", BAILINGMOE, false, false),
    pats("seed-coder", SEED_CODER, false, false),
    pats("ufakzeka", UFAKZEKA, false, false),
    pats("afmoe", AFMOE, false, false),
    pats("laguna", LAGUNA, false, false),
    pats("kimi-k2", &[KIMI_K2_PATTERN], false, false),
    raw("gemma4"),
    raw("granite-embed-multi-311m"),
    PreTokenizerConfig {
        add_bos_default: false,
        ..raw("sarvam-moe")
    },
];

// In this module rather than beside the type so that `pretok` does not import the table
// that imports it.
impl PreTokenizer {
    /// Maps a `tokenizer.ggml.pre` value to its configuration ([`NAMES`]);
    /// `None` for any other name.
    pub fn from_name(name: &str) -> Option<PreTokenizerConfig> {
        NAMES.iter().find(|c| c.name == name).copied()
    }
}

/// The names of [`NAMES`], quoted and comma-separated (for error messages).
pub fn supported_names() -> String {
    NAMES
        .iter()
        .map(|c| format!("{:?}", c.name))
        .collect::<Vec<_>>()
        .join(", ")
}

/// One step of a compiled split plan.
#[derive(Debug, Clone)]
enum Step {
    /// A hand-written splitter, run over each piece.
    Builtin(PreTokenizer),
    /// A pattern run by the reference-equivalent engine.
    Pattern(Box<RefRegex>),
}

/// The compiled split of one vocabulary: its steps, in order.
#[derive(Debug, Clone)]
pub struct SplitPlan {
    steps: Vec<Step>,
}

/// The hand-written splitter the reference's custom code stands in for, if `pattern` is
/// one it intercepts.
fn custom_splitter(pattern: &str) -> Option<PreTokenizer> {
    match pattern {
        GPT2_PATTERN => Some(P::Gpt2),
        LLAMA3_PATTERN | LLAMA3_PATTERN_CI => Some(P::Llama3),
        QWEN2_PATTERN => Some(P::Qwen2),
        QWEN35_PATTERN => Some(P::Qwen35),
        NEWLINES_PATTERN => Some(P::NewlineRuns),
        AFMOE_DIGITS_PATTERN | TINY_AYA_DIGITS_PATTERN => Some(P::AfmoeDigits),
        KIMI_K2_PATTERN => Some(P::KimiK2),
        _ => None,
    }
}

impl SplitPlan {
    /// Compiles the split a configuration names.
    pub fn new(config: &PreTokenizerConfig) -> Result<SplitPlan, TokenizerError> {
        if config.pre != P::Patterns {
            return Ok(SplitPlan {
                steps: vec![Step::Builtin(config.pre)],
            });
        }
        let mut steps = Vec::with_capacity(config.patterns.len());
        for &pattern in config.patterns {
            steps.push(match custom_splitter(pattern) {
                Some(pre) => Step::Builtin(pre),
                None => Step::Pattern(Box::new(RefRegex::new(pattern).map_err(|e| {
                    TokenizerError::BadPattern {
                        name: config.name,
                        reason: e.to_string(),
                    }
                })?)),
            });
        }
        Ok(SplitPlan { steps })
    }

    /// Splits `text` and calls `emit(start, end)` with the byte range of each non-empty
    /// piece, in order; the pieces cover the text.
    pub fn split(
        &self,
        text: &[u8],
        scratch: &mut SplitScratch,
        emit: &mut impl FnMut(usize, usize),
    ) {
        if let [Step::Builtin(pre)] = self.steps.as_slice() {
            return pre.split(text, scratch, emit);
        }
        scratch.decode(text);
        let n = scratch.cps.len();
        // Piece lengths in code points, as the reference keeps them between its steps.
        let mut lengths = vec![n];
        for step in &self.steps {
            lengths = match step {
                Step::Builtin(pre) => {
                    let mut next = Vec::with_capacity(lengths.len());
                    let mut lo = 0;
                    for &len in &lengths {
                        let mut at = lo;
                        pre.split_range(scratch, lo, lo + len, &mut |a, b| {
                            debug_assert_eq!(a, at);
                            next.push(b - a);
                            at = b;
                        });
                        lo += len;
                    }
                    next
                }
                Step::Pattern(re) => split_with(&scratch.cps, std::slice::from_ref(re), lengths),
            };
        }
        let mut lo = 0;
        for len in lengths {
            if len > 0 {
                emit(scratch.offs[lo] as usize, scratch.offs[lo + len] as usize);
            }
            lo += len;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_every_pattern_compiles() {
        let mut names: Vec<&str> = NAMES.iter().map(|c| c.name).collect();
        names.sort_unstable();
        let before = names.len();
        names.dedup();
        assert_eq!(names.len(), before, "duplicate pre-tokenizer names");
        for config in NAMES {
            assert!(
                SplitPlan::new(config).is_ok(),
                "{}: a pattern does not compile",
                config.name
            );
            assert_eq!(
                config.pre == P::Patterns,
                !config.patterns.is_empty(),
                "{}",
                config.name
            );
        }
    }

    #[test]
    fn custom_patterns_run_the_hand_written_splitters() {
        assert_eq!(custom_splitter(GPT2_PATTERN), Some(P::Gpt2));
        assert_eq!(
            LAGUNA
                .iter()
                .map(|p| custom_splitter(p))
                .collect::<Vec<_>>(),
            [Some(P::NewlineRuns), Some(P::Qwen2)]
        );
        assert_eq!(custom_splitter(GPT4O[0]), None);
    }

    fn pieces(name: &str, text: &str) -> Vec<String> {
        let config = PreTokenizer::from_name(name).unwrap();
        let plan = SplitPlan::new(&config).unwrap();
        let mut out = Vec::new();
        plan.split(
            text.as_bytes(),
            &mut SplitScratch::default(),
            &mut |a, b| out.push(text[a..b].to_string()),
        );
        out
    }

    #[test]
    fn afmoe_digits_join_the_text_before_them() {
        let split = |text: &str| {
            let mut out = Vec::new();
            P::AfmoeDigits.split(
                text.as_bytes(),
                &mut SplitScratch::default(),
                &mut |a, b| out.push(text[a..b].to_string()),
            );
            out
        };
        // The reference's AFMoE splitter: leading digits close the piece begun before them.
        assert_eq!(split("ab1234"), ["ab1", "234"]);
        assert_eq!(split("x12345y"), ["x12", "345", "y"]);
        assert_eq!(split("ab123456"), ["ab123", "456"]);
        assert_eq!(split("no digits"), ["no digits"]);
        assert_eq!(pieces("laguna", "a\n\nb"), ["a", "\n\n", "b"]);
    }
}
