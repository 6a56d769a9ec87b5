//! Reads the Arrow IPC streams that HuggingFace `datasets` writes (MMLU's tables in the
//! evaluation package): utf8, list<utf8> and int64 columns, over any number of record
//! batches, which read as one table.
//!
//! The decoding is `arrow-ipc`'s, with its validation on, rather than a reader of our
//! own: the format (flatbuffer metadata, buffer layouts, offsets) has many more corners
//! than a hand-written reader can keep checked, and the crate costs little build time
//! with its default features (compression codecs) off. Two guards stand in front of it so
//! that a damaged file gives an error naming it, never a panic or an abort: the messages'
//! framing is checked first (see [`check_framing`]), and the decode runs under
//! `catch_unwind`, a panic in it becoming [`ArrowError::Format`].
//!
//! Format: <https://arrow.apache.org/docs/format/Columnar.html#serialization-and-interprocess-communication-ipc>.

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Array, RecordBatch};
use arrow_ipc::reader::StreamReader;
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum ArrowError {
    #[error("cannot read Arrow file {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a readable Arrow IPC stream: {reason}")]
    Format { path: PathBuf, reason: String },
    #[error("{path}: column `{column}`: {reason}")]
    Column {
        path: PathBuf,
        column: String,
        reason: String,
    },
}

/// One decoded stream: its schema and its record batches, in order.
#[derive(Debug)]
pub struct ArrowTable {
    path: PathBuf,
    schema: SchemaRef,
    batches: Vec<RecordBatch>,
    rows: usize,
}

impl ArrowTable {
    pub fn read(path: &Path) -> Result<Self, ArrowError> {
        let bytes = std::fs::read(path).map_err(|e| ArrowError::Io {
            path: path.to_path_buf(),
            source: e,
        })?;
        Self::from_bytes(path, &bytes)
    }

    /// Decodes a stream held in memory; `path` only names it in errors.
    pub fn from_bytes(path: &Path, bytes: &[u8]) -> Result<Self, ArrowError> {
        let (schema, batches) = guarded(|| decode(bytes)).map_err(|reason| ArrowError::Format {
            path: path.to_path_buf(),
            reason,
        })?;
        let rows = batches.iter().map(RecordBatch::num_rows).sum();
        Ok(Self {
            path: path.to_path_buf(),
            schema,
            batches,
            rows,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn schema(&self) -> &Schema {
        &self.schema
    }

    /// Rows over all record batches.
    pub fn num_rows(&self) -> usize {
        self.rows
    }

    /// A utf8 or large_utf8 column; a null is an error.
    pub fn utf8(&self, column: &str) -> Result<Vec<String>, ArrowError> {
        let (i, field) = self.column(column)?;
        if !is_string(field.data_type()) {
            return Err(self.wrong_type(field, "utf8"));
        }
        let mut out = Vec::with_capacity(self.rows);
        for (array, base) in self.arrays(i) {
            let values = string_values(array).ok_or_else(|| self.mismatch(field, array))?;
            for (r, v) in values.into_iter().enumerate() {
                out.push(
                    v.ok_or_else(|| self.null_err(column, base + r))?
                        .to_string(),
                );
            }
        }
        Ok(out)
    }

    /// A list<utf8> column (large_list and large_utf8 too); a null list or a null item is
    /// an error.
    pub fn list_utf8(&self, column: &str) -> Result<Vec<Vec<String>>, ArrowError> {
        let (i, field) = self.column(column)?;
        let item_is_string = match field.data_type() {
            DataType::List(item) | DataType::LargeList(item) => is_string(item.data_type()),
            _ => false,
        };
        if !item_is_string {
            return Err(self.wrong_type(field, "list<utf8>"));
        }
        let mut out = Vec::with_capacity(self.rows);
        for (array, base) in self.arrays(i) {
            let (lists, items) = list_ranges(array).ok_or_else(|| self.mismatch(field, array))?;
            let items = string_values(items).ok_or_else(|| self.mismatch(field, array))?;
            for (r, list) in lists.into_iter().enumerate() {
                let row = base + r;
                let range = list.ok_or_else(|| self.null_err(column, row))?;
                let slice = items.get(range).ok_or_else(|| {
                    self.col_err(column, format!("row {row}: list runs past its items"))
                })?;
                let strings = slice.iter().enumerate().map(|(k, item)| {
                    item.map(str::to_string)
                        .ok_or_else(|| self.col_err(column, format!("row {row} item {k} is null")))
                });
                out.push(strings.collect::<Result<_, _>>()?);
            }
        }
        Ok(out)
    }

    /// A signed 64-bit integer column; a null is an error. Other widths and unsigned
    /// integers are refused rather than converted, so a schema change shows up here.
    pub fn int64(&self, column: &str) -> Result<Vec<i64>, ArrowError> {
        let (i, field) = self.column(column)?;
        if field.data_type() != &DataType::Int64 {
            return Err(self.wrong_type(field, "int64"));
        }
        let mut out = Vec::with_capacity(self.rows);
        for (array, base) in self.arrays(i) {
            let values = array
                .as_primitive_opt::<Int64Type>()
                .ok_or_else(|| self.mismatch(field, array))?;
            for (r, v) in values.iter().enumerate() {
                out.push(v.ok_or_else(|| self.null_err(column, base + r))?);
            }
        }
        Ok(out)
    }

    fn column(&self, name: &str) -> Result<(usize, &Field), ArrowError> {
        self.schema.column_with_name(name).ok_or_else(|| {
            let names: Vec<&str> = self
                .schema
                .fields()
                .iter()
                .map(|f| f.name().as_str())
                .collect();
            self.col_err(
                name,
                format!("no such column; the table has: {}", names.join(", ")),
            )
        })
    }

    /// Column `i` of each record batch, with the table row its first row is.
    fn arrays(&self, i: usize) -> impl Iterator<Item = (&dyn Array, usize)> {
        self.batches.iter().scan(0usize, move |base, b| {
            let here = *base;
            *base += b.num_rows();
            Some((b.column(i).as_ref(), here))
        })
    }

    fn col_err(&self, column: &str, reason: String) -> ArrowError {
        ArrowError::Column {
            path: self.path.clone(),
            column: column.to_string(),
            reason,
        }
    }

    fn null_err(&self, column: &str, row: usize) -> ArrowError {
        self.col_err(
            column,
            format!("row {row} is null; every value must be present"),
        )
    }

    fn wrong_type(&self, field: &Field, want: &str) -> ArrowError {
        self.col_err(
            field.name(),
            format!(
                "has type {}; this reader decodes it only as {want}",
                type_name(field.data_type())
            ),
        )
    }

    /// A batch's array that is not of its schema's type. Arrow checks batches against
    /// the schema, so this is not expected; it is an error all the same.
    fn mismatch(&self, field: &Field, array: &dyn Array) -> ArrowError {
        self.col_err(
            field.name(),
            format!(
                "a record batch holds {} where the schema says {}",
                type_name(array.data_type()),
                type_name(field.data_type())
            ),
        )
    }
}

/// The schema and the record batches of a stream, decoded and validated by `arrow-ipc`.
fn decode(bytes: &[u8]) -> Result<(SchemaRef, Vec<RecordBatch>), String> {
    check_framing(bytes)?;
    let reader = StreamReader::try_new(bytes, None).map_err(|e| e.to_string())?;
    let schema = reader.schema();
    let batches = reader
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    Ok((schema, batches))
}

/// Runs a decode, turning a panic in it into an error. Third-party decoders may assert
/// on hostile input rather than return an error.
fn guarded<T>(decode: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(decode)).unwrap_or_else(|panic| {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "no message".into());
        Err(format!("the Arrow decoder failed on it ({what})"))
    })
}

/// Marks a message whose length follows (`0xFFFFFFFF`); older writers omit it.
const CONTINUATION: [u8; 4] = [0xff; 4];

/// Checks that the stream is a sequence of whole messages: each one's metadata is a
/// valid `Message` flatbuffer and its body lies within the bytes, up to the end-of-stream
/// marker or the exact end of the bytes (writers may omit the marker). `arrow-ipc`'s
/// reader sizes a body's buffer from the declared length before reading it, so a damaged
/// length could ask for terabytes (an abort, which `catch_unwind` cannot catch), and it
/// takes a stream that stops inside a message's length prefix for a complete one.
fn check_framing(bytes: &[u8]) -> Result<(), String> {
    let word = |pos: usize| -> Result<[u8; 4], String> {
        bytes
            .get(pos..pos + 4)
            .map(|w| [w[0], w[1], w[2], w[3]])
            .ok_or_else(|| format!("truncated: the stream ends inside the message at byte {pos}"))
    };
    let mut pos = 0;
    while pos < bytes.len() {
        let start = pos;
        let truncated = || format!("truncated: the stream ends inside the message at byte {start}");
        let mut prefix = word(pos).map_err(|_| truncated())?;
        pos += 4;
        if prefix == CONTINUATION {
            prefix = word(pos).map_err(|_| truncated())?;
            pos += 4;
        }
        let meta_len = match i32::from_le_bytes(prefix) {
            0 => return Ok(()), // the end-of-stream marker; what follows is not read
            n => usize::try_from(n)
                .map_err(|_| format!("message at byte {start} has a negative length ({n})"))?,
        };
        let meta = bytes.get(pos..pos + meta_len).ok_or_else(truncated)?;
        let message = arrow_ipc::root_as_message(meta)
            .map_err(|e| format!("message at byte {start} has unreadable metadata: {e}"))?;
        pos += meta_len;
        let body = usize::try_from(message.bodyLength()).map_err(|_| {
            let n = message.bodyLength();
            format!("message at byte {start} has a negative body length ({n})")
        })?;
        if body > bytes.len() - pos {
            return Err(truncated());
        }
        pos += body;
    }
    Ok(())
}

fn is_string(t: &DataType) -> bool {
    matches!(t, DataType::Utf8 | DataType::LargeUtf8)
}

/// The values of a utf8 or large_utf8 array, None for a null slot; None for any other
/// type.
fn string_values(array: &dyn Array) -> Option<Vec<Option<&str>>> {
    match array.data_type() {
        DataType::Utf8 => Some(array.as_string_opt::<i32>()?.iter().collect()),
        DataType::LargeUtf8 => Some(array.as_string_opt::<i64>()?.iter().collect()),
        _ => None,
    }
}

/// Each list's range in the item array (None for a null list) and the item array; None
/// for a type that is not a list or large list.
#[allow(clippy::type_complexity)]
fn list_ranges(array: &dyn Array) -> Option<(Vec<Option<Range<usize>>>, &dyn Array)> {
    fn ranges<O: arrow_array::OffsetSizeTrait>(
        list: &arrow_array::GenericListArray<O>,
    ) -> Vec<Option<Range<usize>>> {
        let offsets = list.value_offsets();
        (0..list.len())
            .map(|i| {
                let range = offsets[i].as_usize()..offsets[i + 1].as_usize();
                list.is_valid(i).then_some(range)
            })
            .collect()
    }
    match array.data_type() {
        DataType::List(_) => {
            let list = array.as_list_opt::<i32>()?;
            Some((ranges(list), list.values().as_ref()))
        }
        DataType::LargeList(_) => {
            let list = array.as_list_opt::<i64>()?;
            Some((ranges(list), list.values().as_ref()))
        }
        _ => None,
    }
}

/// A type as error messages name it: Arrow's names for the types read here
/// (`utf8`, `list<utf8>`, `int64`, `uint8`), Arrow's own display for the rest.
pub fn type_name(t: &DataType) -> String {
    match t {
        DataType::Utf8 => "utf8".into(),
        DataType::LargeUtf8 => "large_utf8".into(),
        DataType::List(item) => format!("list<{}>", type_name(item.data_type())),
        DataType::LargeList(item) => format!("large_list<{}>", type_name(item.data_type())),
        t if t.is_primitive() => t.to_string().to_lowercase(),
        t => t.to_string(),
    }
}
