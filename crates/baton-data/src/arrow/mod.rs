//! Reads the Arrow IPC streams that HuggingFace `datasets` writes (MMLU's tables in the
//! evaluation package): utf8, list<utf8> and int64 columns, over any number of record
//! batches, which read as one table.
//!
//! The decoding is `arrow-ipc`'s, with its validation on, rather than a reader of our
//! own: the format (flatbuffer metadata, buffer layouts, offsets) has many more corners
//! than a hand-written reader can keep checked, and the crate costs little build time
//! with its default features (compression codecs) off. Two guards stand in front of it so
//! that a damaged file gives an error naming it, never a panic or an abort: the messages'
//! framing is checked first (`check_framing`), and the decode runs under
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

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::builder::{LargeListBuilder, ListBuilder, StringBuilder};
    use arrow_array::{ArrayRef, Int32Array, Int64Array, LargeStringArray, StringArray};
    use arrow_array::{UInt64Array, UInt8Array};
    use arrow_ipc::writer::StreamWriter;
    use std::sync::Arc;

    const FIXTURE: &[u8] = include_bytes!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/mmlu_abstract_algebra_dev.arrow"
    ));

    const EOS: [u8; 8] = [0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0];

    fn read(bytes: &[u8]) -> Result<ArrowTable, ArrowError> {
        ArrowTable::from_bytes(Path::new("mmlu_abstract_algebra_dev.arrow"), bytes)
    }

    /// Decodes every column the way the MMLU loader does.
    fn decode_all(t: &ArrowTable) -> Result<(), ArrowError> {
        t.utf8("question")?;
        t.utf8("subject")?;
        t.list_utf8("choices")?;
        t.int64("answer")?;
        Ok(())
    }

    #[test]
    fn the_real_fixture_reads_as_written() {
        let t = read(FIXTURE).unwrap();
        assert_eq!(t.num_rows(), 5);
        let fields = t.schema().fields();
        let names: Vec<_> = fields.iter().map(|f| f.name().as_str()).collect();
        assert_eq!(names, ["question", "subject", "choices", "answer"]);
        let types: Vec<_> = fields.iter().map(|f| type_name(f.data_type())).collect();
        assert_eq!(types, ["utf8", "utf8", "list<utf8>", "int64"]);
        let q = t.utf8("question").unwrap();
        assert_eq!(q.len(), 5);
        assert_eq!(
            q[0],
            "Find all c in Z_3 such that Z_3[x]/(x^2 + c) is a field."
        );
        assert_eq!(q[4], "Find the characteristic of the ring 2Z.");
        assert_eq!(t.utf8("subject").unwrap(), vec!["abstract_algebra"; 5]);
        let c = t.list_utf8("choices").unwrap();
        assert_eq!(c[0], ["0", "1", "2", "3"]);
        assert_eq!(
            c[1],
            ["True, True", "False, False", "True, False", "False, True"]
        );
        assert_eq!(c[4], ["0", "3", "12", "30"]);
        assert_eq!(t.int64("answer").unwrap(), [1, 1, 2, 0, 0]);
    }

    #[test]
    fn asking_for_the_wrong_type_or_a_missing_column_is_an_error() {
        let t = read(FIXTURE).unwrap();
        let e = t.int64("question").unwrap_err().to_string();
        assert!(
            e.contains("`question`") && e.contains("has type utf8"),
            "{e}"
        );
        let e = t.utf8("choices").unwrap_err().to_string();
        assert!(e.contains("list<utf8>"), "{e}");
        let e = t.list_utf8("subject").unwrap_err().to_string();
        assert!(
            e.contains("has type utf8") && e.contains("list<utf8>"),
            "{e}"
        );
        let e = t.utf8("nope").unwrap_err().to_string();
        assert!(e.contains("question, subject, choices, answer"), "{e}");
        assert!(e.contains("mmlu_abstract_algebra_dev.arrow"), "{e}");
    }

    /// Offsets where a message starts, plus the end marker's: a stream cut there is
    /// complete as far as any reader can tell (writers may omit the end marker).
    fn message_boundaries(bytes: &[u8]) -> Vec<usize> {
        let mut out = Vec::new();
        let mut pos = 0;
        while pos + 8 <= bytes.len() {
            out.push(pos);
            let meta = i32::from_le_bytes(bytes[pos + 4..pos + 8].try_into().unwrap()) as usize;
            if meta == 0 {
                break;
            }
            let m = arrow_ipc::root_as_message(&bytes[pos + 8..pos + 8 + meta]).unwrap();
            pos += 8 + meta + m.bodyLength() as usize;
        }
        out
    }

    #[test]
    fn every_truncation_is_an_error_unless_it_falls_between_messages() {
        let bounds = message_boundaries(FIXTURE);
        // Schema, one record batch, end-of-stream marker.
        assert_eq!(bounds.len(), 3, "{bounds:?}");
        assert_eq!(bounds[2] + 8, FIXTURE.len());
        for len in 0..FIXTURE.len() {
            match read(&FIXTURE[..len]) {
                Err(e) => {
                    let e = e.to_string();
                    assert!(e.contains("mmlu_abstract_algebra_dev.arrow"), "{e}");
                }
                Ok(t) => {
                    // Cut after the schema: an empty table; after the batch: all of it.
                    let rows = if len == bounds[1] {
                        0
                    } else if len == bounds[2] {
                        5
                    } else {
                        panic!(
                            "a stream cut at byte {len} of {} was accepted",
                            FIXTURE.len()
                        )
                    };
                    assert_eq!(t.num_rows(), rows, "cut at {len}");
                    decode_all(&t).unwrap();
                }
            }
        }
        assert!(read(&[]).unwrap_err().to_string().contains("schema"));
        for cut in [2, 4, 6] {
            let e = read(&FIXTURE[..FIXTURE.len() - cut]).unwrap_err();
            assert!(e.to_string().contains("truncated"), "{e}");
        }
    }

    #[test]
    fn no_single_corrupted_byte_makes_the_reader_panic() {
        for pos in 0..FIXTURE.len() {
            for v in [0x00, 0xff, 0x7f, 0x80, FIXTURE[pos] ^ 0x01] {
                let mut b = FIXTURE.to_vec();
                b[pos] = v;
                if let Ok(t) = read(&b) {
                    let _ = decode_all(&t);
                }
            }
        }
    }

    #[test]
    fn a_panic_in_the_decoder_is_an_error() {
        let e = guarded::<()>(|| panic!("offset out of range")).unwrap_err();
        assert!(e.contains("offset out of range"), "{e}");
        assert_eq!(guarded(|| Ok(3)), Ok(3));
    }

    fn stream(batches: &[RecordBatch]) -> Vec<u8> {
        let mut w = StreamWriter::try_new(Vec::new(), &batches[0].schema()).unwrap();
        for b in batches {
            w.write(b).unwrap();
        }
        w.into_inner().unwrap()
    }

    fn batch(columns: Vec<(&str, ArrayRef)>) -> RecordBatch {
        RecordBatch::try_from_iter_with_nullable(
            columns.into_iter().map(|(name, a)| (name, a, true)),
        )
        .unwrap()
    }

    fn list(rows: &[Option<Vec<Option<&str>>>]) -> ArrayRef {
        let mut b = ListBuilder::new(StringBuilder::new());
        for row in rows {
            match row {
                Some(items) => {
                    for item in items {
                        b.values().append_option(*item);
                    }
                    b.append(true);
                }
                None => b.append(false),
            }
        }
        Arc::new(b.finish())
    }

    fn mmlu_batch(
        q: &[Option<&str>],
        c: &[Option<Vec<Option<&str>>>],
        a: &[Option<i64>],
    ) -> RecordBatch {
        batch(vec![
            ("question", Arc::new(StringArray::from(q.to_vec()))),
            ("choices", list(c)),
            ("answer", Arc::new(Int64Array::from(a.to_vec()))),
        ])
    }

    #[test]
    fn batches_are_concatenated_with_or_without_the_end_marker() {
        let mut s = stream(&[
            mmlu_batch(
                &[Some("q0"), Some("q1")],
                &[Some(vec![Some("a"), Some("b")]), Some(vec![])],
                &[Some(0), Some(-7)],
            ),
            mmlu_batch(
                &[Some(" q2 ")],
                &[Some(vec![Some("c"), Some("dé"), Some("")])],
                &[Some(i64::MAX)],
            ),
        ]);
        let check = |bytes: &[u8]| {
            let t = read(bytes).unwrap();
            assert_eq!(t.num_rows(), 3);
            assert_eq!(t.utf8("question").unwrap(), ["q0", "q1", " q2 "]);
            let c = t.list_utf8("choices").unwrap();
            assert_eq!(c, vec![vec!["a", "b"], vec![], vec!["c", "dé", ""]]);
            assert_eq!(t.int64("answer").unwrap(), [0, -7, i64::MAX]);
        };
        check(&s);
        assert!(s.ends_with(&EOS));
        check(&s[..s.len() - EOS.len()]);
        // Anything after the end marker is not part of the stream.
        s.extend([1, 2, 3]);
        check(&s);
    }

    #[test]
    fn large_utf8_and_large_list_read_as_utf8_and_list() {
        let mut choices = LargeListBuilder::new(StringBuilder::new());
        choices.values().append_value("x");
        choices.values().append_value("y");
        choices.append(true);
        let s = stream(&[batch(vec![
            ("question", Arc::new(LargeStringArray::from(vec!["q"]))),
            ("choices", Arc::new(choices.finish())),
        ])]);
        let t = read(&s).unwrap();
        assert_eq!(t.utf8("question").unwrap(), ["q"]);
        assert_eq!(t.list_utf8("choices").unwrap(), [["x", "y"]]);
    }

    #[test]
    fn a_null_names_the_column_and_the_row_across_batches() {
        let s = stream(&[
            mmlu_batch(&[Some("q0")], &[Some(vec![Some("a")])], &[Some(0)]),
            mmlu_batch(
                &[Some("q1"), None],
                &[Some(vec![Some("a"), None]), None],
                &[Some(1), None],
            ),
        ]);
        let t = read(&s).unwrap();
        let e = t.utf8("question").unwrap_err().to_string();
        assert!(
            e.contains("`question`") && e.contains("row 2 is null"),
            "{e}"
        );
        let e = t.int64("answer").unwrap_err().to_string();
        assert!(e.contains("`answer`") && e.contains("row 2 is null"), "{e}");
        let e = t.list_utf8("choices").unwrap_err().to_string();
        assert!(
            e.contains("`choices`") && e.contains("row 1 item 1 is null"),
            "{e}"
        );
        // A null list, not a null item, in a batch of its own.
        let s = stream(&[
            mmlu_batch(&[Some("q0")], &[Some(vec![Some("a")])], &[Some(0)]),
            mmlu_batch(&[Some("q1")], &[None], &[Some(1)]),
        ]);
        let e = read(&s).unwrap().list_utf8("choices").unwrap_err();
        assert!(e.to_string().contains("row 1 is null"), "{e}");
    }

    #[test]
    fn integers_other_than_int64_are_refused_not_converted() {
        let columns: [(ArrayRef, &str); 3] = [
            (Arc::new(UInt64Array::from(vec![1])), "uint64"),
            (Arc::new(Int32Array::from(vec![1])), "int32"),
            (Arc::new(UInt8Array::from(vec![1])), "uint8"),
        ];
        for (array, name) in columns {
            let t = read(&stream(&[batch(vec![("answer", array)])])).unwrap();
            let e = t.int64("answer").unwrap_err().to_string();
            assert!(
                e.contains("`answer`") && e.contains(&format!("has type {name}")),
                "{e}"
            );
            assert!(e.contains("only as int64"), "{e}");
        }
    }

    #[test]
    fn invalid_data_in_a_batch_is_an_error_naming_the_file() {
        // A utf8 column whose bytes are not UTF-8, written without arrow's checks; the
        // array is never read as text here.
        let values = arrow_array::BinaryArray::from(vec![&[0xc3u8, 0x28][..]]);
        let (offsets, bytes, nulls) = values.into_parts();
        // SAFETY: the array only goes to the writer, which copies its buffers.
        let bad = unsafe { StringArray::new_unchecked(offsets, bytes, nulls) };
        let s = stream(&[batch(vec![("q", Arc::new(bad) as ArrayRef)])]);
        let e = read(&s).unwrap_err();
        assert!(matches!(e, ArrowError::Format { .. }), "{e}");
        assert!(
            e.to_string().contains("mmlu_abstract_algebra_dev.arrow"),
            "{e}"
        );
        assert!(e.to_string().to_lowercase().contains("utf"), "{e}");

        // A body length far beyond the file is refused before anything is allocated.
        let mut s = stream(&[mmlu_batch(&[Some("q")], &[None], &[Some(1)])]);
        let bounds = message_boundaries(&s);
        let meta = bounds[1] + 8;
        let len = i32::from_le_bytes(s[bounds[1] + 4..meta].try_into().unwrap()) as usize;
        let body = arrow_ipc::root_as_message(&s[meta..meta + len])
            .unwrap()
            .bodyLength();
        let at = s[meta..meta + len]
            .windows(8)
            .position(|w| w == body.to_le_bytes())
            .unwrap();
        s[meta + at + 5] = 0x7f;
        let e = read(&s).unwrap_err().to_string();
        assert!(e.contains("truncated"), "{e}");
    }
}
