//! Typed reads of GGUF metadata values, with errors that name the key and what was
//! found there instead.

use super::error::TokenizerError;
use candle_core::quantized::gguf_file::{Content, Value};

pub(crate) fn meta<'a>(content: &'a Content, key: &str) -> Option<&'a Value> {
    content.metadata.get(key)
}

fn bad(key: &str, message: impl Into<String>) -> TokenizerError {
    TokenizerError::BadMetadata {
        key: key.to_string(),
        message: message.into(),
    }
}

pub(crate) fn meta_str<'a>(
    content: &'a Content,
    key: &str,
) -> Result<Option<&'a str>, TokenizerError> {
    match meta(content, key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.as_str())),
        Some(v) => Err(bad(
            key,
            format!("expected a string, found {:?}", v.value_type()),
        )),
    }
}

pub(crate) fn value_to_i64(v: &Value) -> Option<i64> {
    Some(match v {
        Value::U8(x) => i64::from(*x),
        Value::I8(x) => i64::from(*x),
        Value::U16(x) => i64::from(*x),
        Value::I16(x) => i64::from(*x),
        Value::U32(x) => i64::from(*x),
        Value::I32(x) => i64::from(*x),
        Value::U64(x) => i64::try_from(*x).ok()?,
        Value::I64(x) => *x,
        _ => return None,
    })
}

pub(crate) fn meta_u32(content: &Content, key: &str) -> Result<Option<u32>, TokenizerError> {
    match meta(content, key) {
        None => Ok(None),
        Some(v) => {
            let i = value_to_i64(v).ok_or_else(|| {
                bad(
                    key,
                    format!("expected an integer, found {:?}", v.value_type()),
                )
            })?;
            u32::try_from(i)
                .map(Some)
                .map_err(|_| bad(key, format!("{i} is not a valid token id")))
        }
    }
}

pub(crate) fn meta_bool(content: &Content, key: &str) -> Result<Option<bool>, TokenizerError> {
    match meta(content, key) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => match value_to_i64(v) {
            Some(i) => Ok(Some(i != 0)),
            None => Err(bad(
                key,
                format!("expected a bool, found {:?}", v.value_type()),
            )),
        },
    }
}

pub(crate) fn meta_str_array<'a>(
    content: &'a Content,
    key: &str,
) -> Result<Vec<&'a str>, TokenizerError> {
    let v = meta(content, key).ok_or_else(|| TokenizerError::MissingKey(key.to_string()))?;
    let Value::Array(items) = v else {
        return Err(bad(
            key,
            format!("expected an array, found {:?}", v.value_type()),
        ));
    };
    items
        .iter()
        .enumerate()
        .map(|(i, item)| match item {
            Value::String(s) => Ok(s.as_str()),
            other => Err(bad(
                key,
                format!("element {i} is {:?}, expected a string", other.value_type()),
            )),
        })
        .collect()
}

pub(crate) fn int_array(v: &Value, key: &str) -> Result<Vec<i64>, TokenizerError> {
    let Value::Array(items) = v else {
        return Err(bad(
            key,
            format!("expected an array, found {:?}", v.value_type()),
        ));
    };
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            value_to_i64(item).ok_or_else(|| {
                bad(
                    key,
                    format!(
                        "element {i} is {:?}, expected an integer",
                        item.value_type()
                    ),
                )
            })
        })
        .collect()
}
