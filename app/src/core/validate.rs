//! Request validation with the contract's FastAPI-shaped errors. Bodies are read as JSON values
//! and checked field by field, so every error names its field, its kind and the offending input.
use serde_json::{json, Map, Value};

use super::error::{AppError, FieldError};

/// A request type read from [`Fields`]: every rule of the contract is checked while reading, and
/// every error is collected, so a request answers all its problems at once in FastAPI's shape.
/// The API's extractors, the MCP tools and the portal read requests this way.
pub trait FromFields: Sized {
    fn from_fields(fields: &mut Fields) -> Self;

    /// Reads `fields` to the end: the request, or every error found.
    fn read(mut fields: Fields) -> Result<Self, AppError> {
        let value = Self::from_fields(&mut fields);
        fields.finish().map(|()| value)
    }
}

/// A JSON object body (or a query string turned into one) and the errors found while reading it.
pub struct Fields {
    source: &'static str,
    map: Map<String, Value>,
    errors: Vec<FieldError>,
    /// Every `key=value` of a query string in order, repeats included (the map keeps the last).
    pairs: Vec<(String, String)>,
}

impl Fields {
    /// Reads a request body. Malformed JSON and a non-object are 422, as FastAPI answers them.
    pub fn from_json_body(bytes: &[u8]) -> Result<Self, AppError> {
        let value: Value = match serde_json::from_slice(bytes) {
            Ok(v) => v,
            Err(e) => {
                let err = FieldError::new(&["body"], "json_invalid", "JSON decode error")
                    .ctx(json!({"error": e.to_string()}));
                let mut err = err;
                err.loc.push(json!(e.column()));
                return Err(AppError::validation(err));
            }
        };
        Self::from_value(value)
    }

    /// A JSON value that must be an object (an MCP tool's arguments), read as a body.
    pub fn from_value(value: Value) -> Result<Self, AppError> {
        match value {
            Value::Object(map) => Ok(Self {
                source: "body",
                map,
                errors: vec![],
                pairs: vec![],
            }),
            other => Err(AppError::validation(
                FieldError::new(
                    &["body"],
                    "model_attributes_type",
                    "Input should be a valid dictionary or object to extract fields from",
                )
                .input(other),
            )),
        }
    }

    /// Reads `a=1&b=2` query parameters; every value is a string until a getter parses it.
    pub fn from_query(query: Option<&str>) -> Self {
        let pairs = form_urlencoded_pairs(query.unwrap_or_default());
        let mut map = Map::new();
        for (k, v) in &pairs {
            map.insert(k.clone(), Value::String(v.clone()));
        }
        Self {
            source: "query",
            map,
            errors: vec![],
            pairs,
        }
    }

    /// A form body (`application/x-www-form-urlencoded`).
    pub fn from_form(body: &[u8]) -> Self {
        let mut map = Map::new();
        for (k, v) in form_urlencoded_pairs(&String::from_utf8_lossy(body)) {
            map.insert(k, Value::String(v));
        }
        Self {
            source: "body",
            map,
            errors: vec![],
            pairs: vec![],
        }
    }

    fn push(
        &mut self,
        field: &str,
        kind: &str,
        msg: impl Into<String>,
        input: Option<&Value>,
        ctx: Option<Value>,
    ) {
        let mut e = FieldError::new(&[self.source, field], kind, msg);
        e.input = input.cloned();
        e.ctx = ctx;
        self.errors.push(e);
    }

    /// Whether the field was sent at all (even as null).
    pub fn has(&self, field: &str) -> bool {
        self.map.contains_key(field)
    }

    /// The raw value, for fields with their own rules.
    pub fn raw(&self, field: &str) -> Option<&Value> {
        self.map.get(field)
    }

    /// A required string, trimmed, `min..=max` characters long.
    pub fn required_str(&mut self, field: &str, min: usize, max: usize) -> String {
        self.required(field, min, max, true)
    }

    /// A required string kept as sent (passwords), `min..=max` characters long.
    pub fn required_raw_str(&mut self, field: &str, min: usize, max: usize) -> String {
        self.required(field, min, max, false)
    }

    fn required(&mut self, field: &str, min: usize, max: usize, trim: bool) -> String {
        match self.map.get(field).cloned() {
            None | Some(Value::Null) => {
                let input = Value::Object(self.map.clone());
                self.push(field, "missing", "Field required", Some(&input), None);
                String::new()
            }
            Some(v) => self
                .check_str(field, &v, min, max, trim)
                .unwrap_or_default(),
        }
    }

    /// An optional string (absent or null is `None`), trimmed.
    pub fn optional_str(&mut self, field: &str, max: usize) -> Option<String> {
        match self.map.get(field).cloned() {
            None | Some(Value::Null) => None,
            Some(v) => self.check_str(field, &v, 0, max, true),
        }
    }

    fn check_str(
        &mut self,
        field: &str,
        v: &Value,
        min: usize,
        max: usize,
        trim: bool,
    ) -> Option<String> {
        let Some(s) = v.as_str() else {
            self.push(
                field,
                "string_type",
                "Input should be a valid string",
                Some(v),
                None,
            );
            return None;
        };
        // The longest length holds for the text as sent (as the document's maxLength says); the
        // shortest for the text once trimmed, so blanks alone are not a value.
        let sent_len = s.chars().count();
        let s = if trim { s.trim() } else { s };
        if s.contains('\0') {
            self.push(field, "value_error", NUL_MESSAGE, Some(v), None);
            return None;
        }
        let len = s.chars().count();
        if len < min {
            let plural = if min == 1 { "character" } else { "characters" };
            self.push(
                field,
                "string_too_short",
                format!("String should have at least {min} {plural}"),
                Some(v),
                Some(json!({"min_length": min})),
            );
            return None;
        }
        if sent_len > max {
            self.push(
                field,
                "string_too_long",
                format!("String should have at most {max} characters"),
                Some(v),
                Some(json!({"max_length": max})),
            );
            return None;
        }
        Some(s.to_string())
    }

    /// An optional integer in `min..=max`, `default` when absent. Query strings are parsed.
    pub fn int_in(&mut self, field: &str, default: i64, min: i64, max: i64) -> i64 {
        let parse = |v: &Value, query: bool| match v {
            // `93.0` is an integer to JSON Schema and to FastAPI alike; `93.5` is not.
            Value::Number(n) => n.as_i64().or_else(|| {
                n.as_f64()
                    .filter(|f| f.fract() == 0.0 && f.abs() < 9.0e15)
                    .map(|f| f as i64)
            }),
            Value::String(s) if query => s.trim().parse::<i64>().ok(),
            _ => None,
        };
        self.number_in(
            field,
            min,
            max,
            parse,
            ("int_parsing", "integer", "an integer"),
        )
        .unwrap_or(default)
    }

    /// An optional number in `min..=max` (query strings are parsed); `None` when absent.
    pub fn optional_number(&mut self, field: &str, min: f64, max: f64) -> Option<f64> {
        let parse = |v: &Value, query: bool| match v {
            Value::Number(n) => n.as_f64(),
            Value::String(s) if query => s.trim().parse::<f64>().ok().filter(|n| n.is_finite()),
            _ => None,
        };
        self.number_in(
            field,
            min,
            max,
            parse,
            ("float_parsing", "number", "a number"),
        )
    }

    /// A number read by `parse` and checked against `min..=max`; `None` when absent or wrong.
    /// `names` are the error's type and how the message names the kind of number.
    fn number_in<T: PartialOrd + std::fmt::Display + serde::Serialize + Copy>(
        &mut self,
        field: &str,
        min: T,
        max: T,
        parse: impl Fn(&Value, bool) -> Option<T>,
        names: (&str, &str, &str),
    ) -> Option<T> {
        let v = self.map.get(field).cloned()?;
        let Some(n) = parse(&v, self.source == "query") else {
            let (kind, noun, article_noun) = names;
            let msg = if v.is_string() {
                format!("Input should be a valid {noun}, unable to parse string as {article_noun}")
            } else {
                format!("Input should be a valid {noun}")
            };
            self.push(field, kind, msg, Some(&v), None);
            return None;
        };
        if n < min {
            self.push(
                field,
                "greater_than_equal",
                format!("Input should be greater than or equal to {min}"),
                Some(&v),
                Some(json!({"ge": min})),
            );
            return None;
        }
        if n > max {
            self.push(
                field,
                "less_than_equal",
                format!("Input should be less than or equal to {max}"),
                Some(&v),
                Some(json!({"le": max})),
            );
            return None;
        }
        Some(n)
    }

    /// Every value of a repeatable query parameter (`a=x&a=y`, or `a=x,y`), each one of
    /// `allowed`; in a body, a list of strings.
    pub fn query_list(&mut self, field: &str, allowed: &[&str]) -> Vec<String> {
        let values: Vec<String> = if self.source == "query" {
            self.pairs
                .iter()
                .filter(|(k, _)| k == field)
                .flat_map(|(_, v)| v.split(','))
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
                .collect()
        } else {
            match self.map.get(field) {
                None | Some(Value::Null) => vec![],
                Some(Value::Array(items)) if items.iter().all(Value::is_string) => items
                    .iter()
                    .filter_map(|i| i.as_str().map(str::to_string))
                    .collect(),
                Some(other) => {
                    let other = other.clone();
                    self.push(
                        field,
                        "list_type",
                        "Input should be a valid list",
                        Some(&other),
                        None,
                    );
                    return vec![];
                }
            }
        };
        let mut out = vec![];
        for v in values {
            if allowed.contains(&v.as_str()) {
                if !out.contains(&v) {
                    out.push(v);
                }
            } else {
                let expected = quoted_list(allowed);
                self.push(
                    field,
                    "enum",
                    format!("Input should be {expected}"),
                    Some(&Value::String(v)),
                    Some(json!({"expected": expected})),
                );
            }
        }
        out
    }

    /// The `metadata` rule: a JSON object or null, at most `max_bytes` serialised. `Ok(None)` when
    /// absent (the caller stores `{}`), `Some(Value::Null)` when sent as null.
    pub fn metadata(&mut self, field: &str, max_bytes: usize) -> Option<Value> {
        let v = self.map.get(field).cloned()?;
        match &v {
            Value::Null => Some(Value::Null),
            Value::Object(_) if contains_nul(&v) => {
                self.push(field, "value_error", NUL_MESSAGE, None, None);
                None
            }
            Value::Object(_) => {
                let size = serde_json::to_vec(&v)
                    .map(|b| b.len())
                    .unwrap_or(usize::MAX);
                if size > max_bytes {
                    self.push(
                        field,
                        "value_error",
                        format!(
                            "Value error, metadata must be at most {max_bytes} bytes serialised"
                        ),
                        None,
                        Some(json!({"max_bytes": max_bytes})),
                    );
                    None
                } else {
                    Some(v)
                }
            }
            _ => {
                self.push(
                    field,
                    "dict_type",
                    "Input should be a valid dictionary",
                    Some(&v),
                    None,
                );
                None
            }
        }
    }

    /// A string that must be one of `allowed`.
    pub fn optional_enum(&mut self, field: &str, allowed: &[&str]) -> Option<String> {
        let v = self.map.get(field).cloned()?;
        if v.is_null() {
            return None;
        }
        match v.as_str() {
            Some(s) if allowed.contains(&s) => Some(s.to_string()),
            Some(_) => {
                let expected = quoted_list(allowed);
                self.push(
                    field,
                    "enum",
                    format!("Input should be {expected}"),
                    Some(&v),
                    Some(json!({"expected": expected})),
                );
                None
            }
            None => {
                self.push(
                    field,
                    "string_type",
                    "Input should be a valid string",
                    Some(&v),
                    None,
                );
                None
            }
        }
    }

    /// A required list of `min..=max` items, as sent; `None` (with the error) when missing, not
    /// a list, or of the wrong length. Read each item with [`Self::item`].
    pub fn list(&mut self, field: &str, min: usize, max: usize) -> Option<Vec<Value>> {
        match self.map.get(field).cloned() {
            None | Some(Value::Null) => {
                self.error(field, "missing", "Field required", None);
                None
            }
            Some(Value::Array(items)) if items.len() < min => {
                let plural = if min == 1 { "item" } else { "items" };
                let msg = format!(
                    "List should have at least {min} {plural} after validation, not {}",
                    items.len()
                );
                self.error(field, "too_short", msg, Some(json!({"min_length": min})));
                None
            }
            Some(Value::Array(items)) if items.len() > max => {
                let msg = format!(
                    "List should have at most {max} items after validation, not {}",
                    items.len()
                );
                self.error(field, "too_long", msg, Some(json!({"max_length": max})));
                None
            }
            Some(Value::Array(items)) => Some(items),
            Some(_) => {
                self.error(field, "list_type", "Input should be a valid list", None);
                None
            }
        }
    }

    /// Item `index` of the list `field`, read by its own rules; its errors are located in the
    /// list (`[source, field, index, ...]`).
    pub fn item<T: FromFields>(&mut self, field: &str, index: usize, item: Value) -> Option<T> {
        match Fields::from_value(item).and_then(T::read) {
            Ok(value) => Some(value),
            Err(AppError::Validation(errors)) => {
                for mut e in errors {
                    e.loc.splice(1..1, [json!(field), json!(index)]);
                    self.errors.push(e);
                }
                None
            }
            Err(_) => None,
        }
    }

    /// Adds an error found by a rule of the caller's (an e-mail check, a pattern).
    pub fn error(&mut self, field: &str, kind: &str, msg: impl Into<String>, ctx: Option<Value>) {
        let input = self.map.get(field).cloned();
        self.push(field, kind, msg, input.as_ref(), ctx);
    }

    /// Adds an error found elsewhere (a list item's, read with fields of its own).
    pub fn push_error(&mut self, error: FieldError) {
        self.errors.push(error);
    }

    /// Ends reading: all errors at once, or nothing.
    pub fn finish(self) -> Result<(), AppError> {
        if self.errors.is_empty() {
            Ok(())
        } else {
            Err(AppError::Validation(self.errors))
        }
    }
}

/// The largest `offset` a list takes (a billion rows in: further than any account goes).
pub const MAX_OFFSET: i64 = 1_000_000_000;

/// PostgreSQL's text (and `jsonb`) cannot hold U+0000, so no field may carry it.
const NUL_MESSAGE: &str = "Value error, text must not contain the NUL character (U+0000)";

/// Whether a NUL character is anywhere in `v`, keys included.
fn contains_nul(v: &Value) -> bool {
    match v {
        Value::String(s) => s.contains('\0'),
        Value::Array(items) => items.iter().any(contains_nul),
        Value::Object(map) => map.iter().any(|(k, v)| k.contains('\0') || contains_nul(v)),
        _ => false,
    }
}

fn quoted_list(items: &[&str]) -> String {
    let quoted: Vec<String> = items.iter().map(|s| format!("'{s}'")).collect();
    match quoted.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        _ => quoted.join(""),
    }
}

/// Decodes `application/x-www-form-urlencoded` pairs.
pub fn form_urlencoded_pairs(s: &str) -> Vec<(String, String)> {
    s.split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len()
                && hex(bytes[i + 1]).is_some()
                && hex(bytes[i + 2]).is_some() =>
            {
                out.push(hex(bytes[i + 1]).unwrap_or(0) * 16 + hex(bytes[i + 2]).unwrap_or(0));
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The contract's e-mail rule: a plausible address of at most 254 characters.
pub fn email_problem(email: &str) -> Option<&'static str> {
    if email.chars().count() > 254 {
        return Some("value is not a valid email address: it must be at most 254 characters");
    }
    let Some((local, domain)) = email.rsplit_once('@') else {
        return Some("value is not a valid email address: An email address must have an @-sign.");
    };
    let bad_char = |c: char| {
        c.is_whitespace() || c.is_control() || c == '@' || c == '<' || c == '>' || c == ','
    };
    if local.is_empty() || local.chars().any(bad_char) || local.len() > 64 {
        return Some(
            "value is not a valid email address: There must be something valid before the @-sign.",
        );
    }
    if domain.is_empty()
        || !domain.contains('.')
        || domain.starts_with('.')
        || domain.ends_with('.')
        || domain.contains("..")
        || domain
            .chars()
            .any(|c| !(c.is_alphanumeric() || c == '-' || c == '.'))
    {
        return Some("value is not a valid email address: The part after the @-sign is not valid.");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_decoding_handles_plus_and_escapes() {
        assert_eq!(
            form_urlencoded_pairs("a=b+c&d=%40x%2"),
            vec![("a".into(), "b c".into()), ("d".into(), "@x%2".into())]
        );
    }

    #[test]
    fn email_rule_accepts_plain_addresses_and_rejects_broken_ones() {
        assert!(email_problem("ann@example.com").is_none());
        for bad in [
            "annexample.com",
            "@example.com",
            "ann@",
            "ann@localhost",
            "a b@example.com",
            "ann@exa mple.com",
        ] {
            assert!(email_problem(bad).is_some(), "{bad}");
        }
    }

    #[test]
    fn missing_and_wrong_type_fields_name_their_location() {
        let mut f = Fields::from_json_body(br#"{"content": 5}"#).unwrap();
        f.required_str("content", 1, 10);
        f.required_str("name", 1, 10);
        let Err(AppError::Validation(errs)) = f.finish() else {
            panic!()
        };
        assert_eq!(errs[0].kind, "string_type");
        assert_eq!(errs[1].kind, "missing");
        assert_eq!(errs[1].loc, vec![json!("body"), json!("name")]);
    }
}
