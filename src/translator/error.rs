//! Why a text was not translated, typed so that a caller can tell the text's fault from the
//! model's (a server answers 400 or 500) without matching strings.

/// Whose fault a [`TranslateError`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The request: a text the model cannot take (longer than its positions), an unknown or
    /// unsupported language, options that cannot run (more alternatives than beams, zero
    /// beams, more new tokens than the model has positions). Retrying the same request fails
    /// the same way.
    Input,
    /// The model or the machine: generation failed (a numeric or device error, not enough
    /// memory for the batch). The request itself was valid.
    Model,
}

/// A translation that could not be made: its [`ErrorKind`] and a message that names the
/// problem (the text's length and the model's limit, the unknown code and close matches, ...).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TranslateError {
    kind: ErrorKind,
    message: String,
}

impl TranslateError {
    /// An error of the request.
    pub fn input(message: impl Into<String>) -> Self {
        Self {
            kind: ErrorKind::Input,
            message: message.into(),
        }
    }

    /// An error of the model or the machine.
    pub fn model(message: impl Into<String>) -> Self {
        Self {
            kind: ErrorKind::Model,
            message: message.into(),
        }
    }

    /// Whose fault it is.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// What went wrong, for people.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Whether it is the request's fault ([`ErrorKind::Input`]).
    pub fn is_input(&self) -> bool {
        self.kind == ErrorKind::Input
    }
}

impl std::fmt::Display for TranslateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for TranslateError {}

/// So that `?` on a translator call works in a function returning [`candle::Result`].
impl From<TranslateError> for candle::Error {
    fn from(e: TranslateError) -> Self {
        candle::Error::Msg(e.message)
    }
}
