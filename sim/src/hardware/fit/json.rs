//! What the JSON readers share: parsing with a located error, and where a key is.

use routelab_policies::located::InputError;
use serde_json::Value;

use super::FitInput;

/// Line and column of the first `"key"` in `text` (JSON keeps no positions once parsed; keys
/// of the flat files read here are unique enough to point at).
pub(super) fn key_position(text: &str, key: &str) -> (Option<u32>, Option<u32>) {
    let needle = format!("\"{key}\"");
    let Some(at) = text.find(&needle) else {
        return (None, None);
    };
    let before = &text[..at];
    let line = before.matches('\n').count() + 1;
    let col = at - before.rfind('\n').map_or(0, |i| i + 1) + 1;
    (u32::try_from(line).ok(), u32::try_from(col).ok())
}

/// `input` parsed as JSON; `what` says what it should hold.
pub(super) fn parse_json(input: &FitInput, what: &str) -> Result<Value, InputError> {
    serde_json::from_str(&input.text).map_err(|e| {
        InputError::new(&input.origin, "", format!("not JSON: {e}"))
            .at(u32::try_from(e.line()).ok(), u32::try_from(e.column()).ok())
            .valid(what.to_string())
    })
}
