//! Chat templates (Jinja, rendered with minijinja) and a chat session that reuses the
//! KV cache from one turn to the next.
//!
//! ## Templates
//! A [`ChatTemplate`] turns a list of [`ChatMessage`]s into the prompt text a model was
//! trained on. Its source is, in order of preference:
//! 1. an explicit [`TemplateChoice`] (`--chat-template NAME|FILE`),
//! 2. the GGUF's `tokenizer.chat_template`,
//! 3. a [`BuiltinTemplate`] chosen by `general.architecture` (Gemma for `gemma*`, Llama 3
//!    for `llama` when the vocabulary has Llama 3's header tokens, ChatML otherwise).
//!
//! Templates see what Hugging Face's and llama.cpp's renderers provide: `messages`
//! (a list of `{role, content}` maps), `add_generation_prompt`, `bos_token` and
//! `eos_token` (the texts of the vocabulary's BOS/EOS tokens), `raise_exception(msg)`
//! (reported as [`ChatError::Raised`]), the Jinja built-in filters and tests, `tojson`,
//! loop controls, and Python string/dict methods (`.strip()`, `.split()`, `.items()`…).
//! Blocks are trimmed like Hugging Face's environment (`trim_blocks`, `lstrip_blocks`).
//! Rendering is bounded by a fuel limit, so a hostile template cannot loop for ever.
//!
//! ## Tokens
//! [`ChatTemplate::encode`] follows llama.cpp: when the vocabulary adds BOS by itself,
//! a leading BOS text in the rendered prompt is removed first (likewise a trailing EOS
//! text when it adds EOS), then the text is encoded with special tokens added as the
//! vocabulary asks and special-token texts (`<start_of_turn>`, `<|im_start|>`) read as
//! those tokens. So BOS appears exactly once whether or not the template writes it.
//!
//! ## Sessions
//! [`ChatSession`] keeps a conversation and a [`Runner`]. Each turn renders the whole
//! conversation, keeps the longest common prefix of the new tokens and the tokens
//! already in the KV cache, and prefills only the rest: usually just the end-of-turn
//! marker, the new user turn and the generation prompt.

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use minijinja::value::Value;
use minijinja::{Environment, ErrorKind, UndefinedBehavior};
use nx_bpe::{EncodeOptions, Tokenizer, TokenizerError};
use nx_gguf::Metadata;

use crate::{Completion, Event, Prompt, RunError, Runner, StopReason};

/// GGUF key of the model's own chat template.
pub const CHAT_TEMPLATE_KEY: &str = "tokenizer.chat_template";

/// Render steps one template render may take. The built-in templates render a
/// 1000-message conversation in about 2 ms, some 70 000 steps; this allows ~70 times
/// that and stops a runaway loop after about 0.15 s.
pub const RENDER_FUEL: u64 = 5_000_000;

/// Longest prompt text a template may render (far longer than any context holds once
/// encoded; a template that writes more is hostile or broken and gets an error).
pub const MAX_RENDER_BYTES: usize = 8 << 20;

/// Name under which the template is registered in its environment (shows in errors).
const TEMPLATE_NAME: &str = "chat_template";

/// Why a chat prompt could not be built or a chat turn could not run.
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    /// `--chat-template` named neither a built-in template nor an existing file.
    #[error(
        "unknown chat template {0:?}: not a built-in name (chatml, llama3, gemma) and no such file"
    )]
    UnknownTemplate(String),
    /// A template file could not be read.
    #[error("reading chat template {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The template source does not parse.
    #[error("chat template from {origin} does not parse: {message}")]
    Syntax { origin: String, message: String },
    /// The template called `raise_exception(message)`.
    #[error("chat template from {origin} refused the conversation: {message}")]
    Raised { origin: String, message: String },
    /// Rendering wrote more than [`MAX_RENDER_BYTES`].
    #[error("chat template from {origin} rendered more than {limit} bytes", limit = MAX_RENDER_BYTES)]
    TooLong { origin: String },
    /// Rendering failed (undefined operation, type error, fuel exhausted, …).
    #[error("chat template from {origin} failed to render: {message}")]
    Render { origin: String, message: String },
    /// The conversation (without any answer) does not fit in the context.
    #[error(
        "the conversation needs {needed} positions (prompt + at least one answer token), \
         more than the context of {n_ctx}"
    )]
    ContextFull { needed: usize, n_ctx: usize },
    /// The runner has no tokenizer, so text cannot be encoded.
    #[error("a chat needs a tokenizer, and this runner has none")]
    NoTokenizer,
    /// Encoding the rendered prompt failed.
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    /// Generating the answer failed.
    #[error(transparent)]
    Run(#[from] RunError),
}

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant` (templates may accept others, e.g. `tool`).
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
    pub fn system(content: impl Into<String>) -> ChatMessage {
        ChatMessage::new("system", content)
    }
    pub fn user(content: impl Into<String>) -> ChatMessage {
        ChatMessage::new("user", content)
    }
    pub fn assistant(content: impl Into<String>) -> ChatMessage {
        ChatMessage::new("assistant", content)
    }
}

/// The chat formats nx knows without a template in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BuiltinTemplate {
    /// `<|im_start|>role\ncontent<|im_end|>\n` (Qwen and many others; llama.cpp's
    /// fallback for models without a template).
    ChatMl,
    /// `<|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|>` after BOS
    /// (`<|begin_of_text|>`); contents trimmed.
    Llama3,
    /// `<start_of_turn>user\ncontent<end_of_turn>\n` after BOS, the assistant's role
    /// written `model`; contents trimmed. Gemma has no system role: system texts are
    /// joined and put at the start of the next user turn, followed by a blank line.
    Gemma,
}

const CHATML_SOURCE: &str = r#"{%- for message in messages -%}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|im_start|>assistant\n' -}}
{%- endif -%}"#;

const LLAMA3_SOURCE: &str = r#"{{- bos_token -}}
{%- for message in messages -%}
{{- '<|start_header_id|>' + message.role + '<|end_header_id|>\n\n' + (message.content | trim) + '<|eot_id|>' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
{%- endif -%}"#;

// The system text waits in a namespace until a turn that is not the model's takes it.
const GEMMA_SOURCE: &str = r#"{{- bos_token -}}
{%- set pending = namespace(system='') -%}
{%- for message in messages -%}
{%- if message.role == 'system' -%}
{%- set pending.system = pending.system + (message.content | trim) -%}
{%- else -%}
{%- set role = 'model' if message.role == 'assistant' else message.role -%}
{{- '<start_of_turn>' + role + '\n' -}}
{%- if pending.system and role != 'model' -%}
{{- pending.system + '\n\n' -}}
{%- set pending.system = '' -%}
{%- endif -%}
{{- (message.content | trim) + '<end_of_turn>\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<start_of_turn>model\n' -}}
{%- endif -%}"#;

impl BuiltinTemplate {
    /// Every built-in template.
    pub const ALL: [BuiltinTemplate; 3] = [
        BuiltinTemplate::ChatMl,
        BuiltinTemplate::Llama3,
        BuiltinTemplate::Gemma,
    ];

    /// `chatml`, `llama3` or `gemma`.
    pub fn name(self) -> &'static str {
        match self {
            BuiltinTemplate::ChatMl => "chatml",
            BuiltinTemplate::Llama3 => "llama3",
            BuiltinTemplate::Gemma => "gemma",
        }
    }

    /// The template named `name` (case-insensitive), if any.
    pub fn from_name(name: &str) -> Option<BuiltinTemplate> {
        BuiltinTemplate::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(name))
    }

    /// The template's Jinja source.
    pub fn source(self) -> &'static str {
        match self {
            BuiltinTemplate::ChatMl => CHATML_SOURCE,
            BuiltinTemplate::Llama3 => LLAMA3_SOURCE,
            BuiltinTemplate::Gemma => GEMMA_SOURCE,
        }
    }

    /// The template for a model of architecture `arch` whose file has none.
    ///
    /// `gemma*` → Gemma. `llama` covers Llama 2, 3 and others that share the graph, so
    /// Llama 3 is chosen only when the vocabulary has its header tokens. Everything else
    /// (qwen2, qwen3, …) gets ChatML, as llama.cpp does for a model without a template.
    pub fn for_architecture(arch: &str, tokenizer: &Tokenizer) -> BuiltinTemplate {
        if arch.starts_with("gemma") {
            BuiltinTemplate::Gemma
        } else if arch == "llama"
            && tokenizer.token_id("<|start_header_id|>").is_some()
            && tokenizer.token_id("<|eot_id|>").is_some()
        {
            BuiltinTemplate::Llama3
        } else {
            BuiltinTemplate::ChatMl
        }
    }
}

/// What `--chat-template` asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TemplateChoice {
    Builtin(BuiltinTemplate),
    /// A Jinja source read from `path`.
    File {
        path: PathBuf,
        source: String,
    },
}

impl TemplateChoice {
    /// A built-in template name (`chatml`, `llama3`, `gemma`), else the path of a Jinja
    /// file, which is read here.
    pub fn parse(name_or_path: &str) -> Result<TemplateChoice, ChatError> {
        if let Some(t) = BuiltinTemplate::from_name(name_or_path) {
            return Ok(TemplateChoice::Builtin(t));
        }
        let path = Path::new(name_or_path);
        if !path.is_file() {
            return Err(ChatError::UnknownTemplate(name_or_path.to_string()));
        }
        let source = std::fs::read_to_string(path).map_err(|source| ChatError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(TemplateChoice::File {
            path: path.to_path_buf(),
            source,
        })
    }
}

/// The error `raise_exception` returns, recognised again after rendering.
#[derive(Debug)]
struct RaisedByTemplate(String);

impl std::fmt::Display for RaisedByTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RaisedByTemplate {}

/// A compiled chat template with the special-token texts it renders.
pub struct ChatTemplate {
    env: Environment<'static>,
    /// Where the source came from, for messages (`the GGUF file`, `built-in gemma`, a path).
    origin: String,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("origin", &self.origin)
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish_non_exhaustive()
    }
}

/// Collects a render's output and refuses (an I/O error, which ends the render) to grow
/// past [`MAX_RENDER_BYTES`].
#[derive(Default)]
struct CappedWriter {
    bytes: Vec<u8>,
    overflowed: bool,
}

impl std::io::Write for CappedWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.bytes.len() + buf.len() > MAX_RENDER_BYTES {
            self.overflowed = true;
            return Err(std::io::Error::other("chat template output cap reached"));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl ChatTemplate {
    /// Compiles `source`. `origin` names it in errors; `bos_token` and `eos_token` are
    /// the texts the template sees under those names.
    pub fn new(
        source: impl Into<String>,
        origin: impl Into<String>,
        bos_token: impl Into<String>,
        eos_token: impl Into<String>,
    ) -> Result<ChatTemplate, ChatError> {
        let origin = origin.into();
        let bos_token = bos_token.into();
        let eos_token = eos_token.into();
        let mut env = Environment::new();
        // Hugging Face renders chat templates with trim_blocks and lstrip_blocks, and
        // llama.cpp's renderer does the same; templates are written for that.
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| ChatError::Syntax {
                origin: origin.clone(),
                message: e.to_string(),
            })?;
        env.set_syntax(syntax);
        env.set_undefined_behavior(UndefinedBehavior::Lenient);
        env.set_fuel(Some(RENDER_FUEL));
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |message: String| -> Result<Value, minijinja::Error> {
                Err(
                    minijinja::Error::new(ErrorKind::InvalidOperation, message.clone())
                        .with_source(RaisedByTemplate(message)),
                )
            },
        );
        env.add_global("bos_token", Value::from(bos_token.clone()));
        env.add_global("eos_token", Value::from(eos_token.clone()));
        env.add_template_owned(TEMPLATE_NAME, source.into())
            .map_err(|e| ChatError::Syntax {
                origin: origin.clone(),
                message: e.to_string(),
            })?;
        Ok(ChatTemplate {
            env,
            origin,
            bos_token,
            eos_token,
        })
    }

    /// The same template with another bound on render steps (default [`RENDER_FUEL`]):
    /// a render that needs more ends with [`ChatError::Render`].
    pub fn with_render_fuel(mut self, fuel: u64) -> ChatTemplate {
        self.env.set_fuel(Some(fuel));
        self
    }

    /// A built-in template with the special-token texts of `tokenizer`.
    pub fn builtin(
        template: BuiltinTemplate,
        tokenizer: &Tokenizer,
    ) -> Result<ChatTemplate, ChatError> {
        let (bos, eos) = special_texts(tokenizer);
        ChatTemplate::new(
            template.source(),
            format!("built-in {}", template.name()),
            bos,
            eos,
        )
    }

    /// The template for a model: `choice` if given, else the file's
    /// `tokenizer.chat_template`, else the built-in one for its architecture.
    pub fn for_model(
        metadata: &Metadata,
        tokenizer: &Tokenizer,
        choice: Option<&TemplateChoice>,
    ) -> Result<ChatTemplate, ChatError> {
        let (bos, eos) = special_texts(tokenizer);
        match choice {
            Some(TemplateChoice::Builtin(t)) => ChatTemplate::builtin(*t, tokenizer),
            Some(TemplateChoice::File { path, source }) => {
                ChatTemplate::new(source.clone(), path.display().to_string(), bos, eos)
            }
            None => match metadata.get(CHAT_TEMPLATE_KEY).and_then(|v| v.as_str()) {
                Some(source) => ChatTemplate::new(source, "the GGUF file", bos, eos),
                None => {
                    let arch = metadata
                        .get("general.architecture")
                        .and_then(|v| v.as_str())
                        .unwrap_or("");
                    ChatTemplate::builtin(
                        BuiltinTemplate::for_architecture(arch, tokenizer),
                        tokenizer,
                    )
                }
            },
        }
    }

    /// Where the template came from (`the GGUF file`, `built-in gemma`, a file path).
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// The text `bos_token` renders as.
    pub fn bos_token(&self) -> &str {
        &self.bos_token
    }

    /// The text `eos_token` renders as.
    pub fn eos_token(&self) -> &str {
        &self.eos_token
    }

    /// Renders `messages` (and, with `add_generation_prompt`, the start of the
    /// assistant's turn) exactly as the template writes it.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ChatError> {
        let list: Vec<Value> = messages
            .iter()
            .map(|m| {
                let mut map = BTreeMap::new();
                map.insert("role".to_string(), Value::from(m.role.as_str()));
                map.insert("content".to_string(), Value::from(m.content.as_str()));
                Value::from(map)
            })
            .collect();
        let ctx = minijinja::context! {
            messages => Value::from(list),
            add_generation_prompt => add_generation_prompt,
        };
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| self.render_error(e))?;
        let mut out = CappedWriter::default();
        match template.render_captured_to(ctx, &mut out) {
            Ok(_) => {}
            Err(_) if out.overflowed => {
                return Err(ChatError::TooLong {
                    origin: self.origin.clone(),
                })
            }
            Err(e) => return Err(self.render_error(e)),
        }
        String::from_utf8(out.bytes).map_err(|_| ChatError::Render {
            origin: self.origin.clone(),
            message: "rendered text is not UTF-8".into(),
        })
    }

    fn render_error(&self, e: minijinja::Error) -> ChatError {
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&e);
        while let Some(c) = cause {
            if let Some(raised) = c.downcast_ref::<RaisedByTemplate>() {
                return ChatError::Raised {
                    origin: self.origin.clone(),
                    message: raised.0.clone(),
                };
            }
            cause = c.source();
        }
        ChatError::Render {
            origin: self.origin.clone(),
            message: e.to_string(),
        }
    }

    /// The rendered prompt as it will be encoded: a leading BOS text is dropped when
    /// `add_bos` (the tokenizer adds BOS itself), a trailing EOS text when `add_eos`,
    /// as llama.cpp does.
    pub fn apply(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        add_bos: bool,
        add_eos: bool,
    ) -> Result<String, ChatError> {
        let mut text = self.render(messages, add_generation_prompt)?;
        if add_bos && !self.bos_token.is_empty() && text.starts_with(&self.bos_token) {
            text.drain(..self.bos_token.len());
        }
        if add_eos && !self.eos_token.is_empty() && text.ends_with(&self.eos_token) {
            text.truncate(text.len() - self.eos_token.len());
        }
        Ok(text)
    }

    /// The token ids of the conversation: [`ChatTemplate::apply`] with the tokenizer's
    /// BOS/EOS flags, encoded with special tokens added and special texts parsed.
    pub fn encode(
        &self,
        tokenizer: &Tokenizer,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<Vec<u32>, ChatError> {
        let text = self.apply(
            messages,
            add_generation_prompt,
            tokenizer.add_bos(),
            tokenizer.add_eos(),
        )?;
        Ok(tokenizer.encode(
            &text,
            EncodeOptions {
                add_special: true,
                parse_special: true,
            },
        )?)
    }
}

/// The texts of the vocabulary's BOS and EOS tokens (empty when it has none).
fn special_texts(tokenizer: &Tokenizer) -> (String, String) {
    let text = |id: Option<u32>| {
        id.and_then(|id| tokenizer.token_to_piece(id).ok())
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .unwrap_or_default()
    };
    (text(tokenizer.bos_id()), text(tokenizer.eos_id()))
}

/// What one [`ChatSession::respond`] did.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatTurn {
    /// The answer's text (also stored as the assistant message).
    pub text: String,
    /// The runner's result.
    pub completion: Completion,
    /// Tokens of the rendered conversation that were already in the KV cache.
    pub reused_tokens: usize,
    /// Tokens of the rendered conversation prefilled for this turn.
    pub new_tokens: usize,
    /// The answer ended because the context has no room left.
    pub context_full: bool,
}

/// A conversation with a model that keeps its KV cache between turns.
pub struct ChatSession {
    runner: Runner,
    template: ChatTemplate,
    system: Option<String>,
    messages: Vec<ChatMessage>,
    /// Most tokens one answer may have (`None`: until end of turn or a full context).
    max_answer_tokens: Option<usize>,
}

impl ChatSession {
    /// A session over `runner` (which must have a tokenizer), starting with a system
    /// message when `system` is given. The runner's sequence is reset.
    pub fn new(
        mut runner: Runner,
        template: ChatTemplate,
        system: Option<String>,
    ) -> Result<ChatSession, ChatError> {
        if runner.tokenizer().is_none() {
            return Err(ChatError::NoTokenizer);
        }
        runner.reset();
        let mut session = ChatSession {
            runner,
            template,
            system,
            messages: Vec::new(),
            max_answer_tokens: None,
        };
        session.reset();
        Ok(session)
    }

    /// Caps the tokens of each answer (`None`: until end of turn or a full context).
    pub fn set_max_answer_tokens(&mut self, max: Option<usize>) {
        self.max_answer_tokens = max;
    }

    /// The conversation so far (the system message first, if any).
    pub fn messages(&self) -> &[ChatMessage] {
        &self.messages
    }

    pub fn template(&self) -> &ChatTemplate {
        &self.template
    }

    pub fn runner(&self) -> &Runner {
        &self.runner
    }

    /// Forgets the conversation (keeping the system message) and the KV cache.
    pub fn reset(&mut self) {
        self.runner.reset();
        self.messages.clear();
        if let Some(s) = &self.system {
            self.messages.push(ChatMessage::system(s.clone()));
        }
    }

    /// The token ids the conversation would be prefilled with if `user` were said next.
    pub fn prompt_ids_with(&self, user: &str) -> Result<Vec<u32>, ChatError> {
        let tokenizer = self.runner.tokenizer().ok_or(ChatError::NoTokenizer)?;
        let mut messages = self.messages.clone();
        messages.push(ChatMessage::user(user));
        self.template.encode(tokenizer, &messages, true)
    }

    /// Adds the user turn `user`, generates the answer (reporting each event to
    /// `on_event`, whose `Break` stops the answer early) and adds it to the
    /// conversation. Only the tokens after the longest prefix shared with the cache are
    /// prefilled.
    ///
    /// A conversation that no longer fits is [`ChatError::ContextFull`] and leaves the
    /// session as it was; an answer cut short by the context has `context_full` set.
    /// On any other error the user turn is not kept.
    pub fn respond(
        &mut self,
        user: &str,
        mut on_event: impl FnMut(&Event) -> ControlFlow<()>,
    ) -> Result<ChatTurn, ChatError> {
        let ids = self.prompt_ids_with(user)?;
        let n_ctx = self.runner.n_ctx();
        // At least one position must be left for the answer.
        if ids.len() >= n_ctx {
            return Err(ChatError::ContextFull {
                needed: ids.len() + 1,
                n_ctx,
            });
        }
        let cached = self.runner.tokens();
        let mut keep = cached.iter().zip(&ids).take_while(|(a, b)| a == b).count();
        // The runner needs at least one new token to produce logits from.
        keep = keep.min(ids.len() - 1);
        self.runner.truncate(keep);

        let room = n_ctx - ids.len();
        let max_tokens = self.max_answer_tokens.map_or(room, |m| m.min(room));
        let limited_by_context = self.max_answer_tokens.is_none_or(|m| m > room);
        self.runner.set_max_tokens(max_tokens);

        self.messages.push(ChatMessage::user(user));
        let mut text = String::new();
        let result = self
            .runner
            .continue_with(Prompt::Ids(ids[keep..].to_vec()), |event| {
                match &event {
                    Event::Token { text: t, .. } => text.push_str(t),
                    Event::Done { flushed, .. } => text.push_str(flushed),
                }
                on_event(&event)
            });
        let completion = match result {
            Ok(c) => c,
            Err(e) => {
                self.messages.pop();
                return Err(e.into());
            }
        };
        self.messages.push(ChatMessage::assistant(text.clone()));
        let context_full = completion.reason == StopReason::MaxTokens && limited_by_context;
        Ok(ChatTurn {
            text,
            completion,
            reused_tokens: keep,
            new_tokens: ids.len() - keep,
            context_full,
        })
    }
}
