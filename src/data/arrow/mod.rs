//! A minimal reader of Arrow IPC streams: enough for the HuggingFace `datasets` tables in
//! the evaluation package (utf8, list<utf8> and int64 columns). The flatbuffer metadata is
//! read by hand so the `arrow` crates and their compile time stay out of the build. Every
//! offset and length taken from the file is checked before use: a damaged file gives an
//! error naming it, never a panic.
//!
//! Format: <https://arrow.apache.org/docs/format/Columnar.html#serialization-and-interprocess-communication-ipc>.

mod ipc;

use ipc::{own_buffers, parse_stream, type_id, type_id_name};
use std::ops::Range;
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

/// A column's type, as far as this reader tells types apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataType {
    Int {
        bit_width: i32,
        signed: bool,
    },
    Utf8,
    LargeUtf8,
    /// Its one child field is the item type.
    List,
    /// A type that is stepped over but not decoded; the number is its id in Arrow's
    /// `Type` union.
    Other(u8),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Field {
    pub name: String,
    pub data_type: DataType,
    pub nullable: bool,
    pub children: Vec<Field>,
}

impl Field {
    /// The type as Arrow's own tools print it, for error messages.
    pub fn type_name(&self) -> String {
        match self.data_type {
            DataType::Int { bit_width, signed } => {
                format!("{}int{bit_width}", if signed { "" } else { "u" })
            }
            DataType::Utf8 => "utf8".into(),
            DataType::LargeUtf8 => "large_utf8".into(),
            DataType::List => match self.children.first() {
                Some(item) => format!("list<{}>", item.type_name()),
                None => "list".into(),
            },
            DataType::Other(id) => format!("{} (Arrow type id {id})", type_id_name(id)),
        }
    }

    fn node_count(&self) -> usize {
        1 + self.children.iter().map(Field::node_count).sum::<usize>()
    }

    fn buffer_count(&self) -> usize {
        // Known to be Some: `parse_field` refuses types without a known layout.
        own_buffers(type_id(self.data_type)).unwrap_or(0)
            + self.children.iter().map(Field::buffer_count).sum::<usize>()
    }
}

/// One decoded stream: the schema and the record batches, whose columns are decoded on
/// request so a column the caller never asks for cannot fail the read.
#[derive(Debug)]
pub struct ArrowTable {
    path: PathBuf,
    bytes: Vec<u8>,
    fields: Vec<Field>,
    /// First node and first buffer of each top-level field within a batch (depth-first).
    slots: Vec<(usize, usize)>,
    batches: Vec<Batch>,
    rows: usize,
}

#[derive(Debug)]
pub(crate) struct Batch {
    rows: usize,
    nodes: Vec<Node>,
    /// Absolute ranges in `ArrowTable::bytes`, already checked to lie inside the body.
    buffers: Vec<Range<usize>>,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Node {
    length: usize,
    null_count: usize,
}

pub(crate) type Res<T> = std::result::Result<T, String>;

impl ArrowTable {
    pub fn read(path: &Path) -> Result<Self, ArrowError> {
        let bytes = std::fs::read(path).map_err(|e| ArrowError::Io {
            path: path.to_path_buf(),
            source: e,
        })?;
        Self::from_bytes(path, bytes)
    }

    /// Parses a stream held in memory; `path` only names it in errors.
    pub fn from_bytes(path: &Path, bytes: Vec<u8>) -> Result<Self, ArrowError> {
        let (fields, batches) = parse_stream(&bytes).map_err(|reason| ArrowError::Format {
            path: path.to_path_buf(),
            reason,
        })?;
        let mut slots = Vec::with_capacity(fields.len());
        let (mut node, mut buffer) = (0, 0);
        for f in &fields {
            slots.push((node, buffer));
            node += f.node_count();
            buffer += f.buffer_count();
        }
        let rows = batches.iter().map(|b| b.rows).sum();
        Ok(Self {
            path: path.to_path_buf(),
            bytes,
            fields,
            slots,
            batches,
            rows,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn fields(&self) -> &[Field] {
        &self.fields
    }

    /// Rows over all record batches.
    pub fn num_rows(&self) -> usize {
        self.rows
    }

    /// A utf8 column; a null is an error.
    pub fn utf8(&self, column: &str) -> Result<Vec<String>, ArrowError> {
        let (field, node, buffer) = self.column(column)?;
        if field.data_type != DataType::Utf8 {
            return Err(self.wrong_type(field, "utf8"));
        }
        let mut out = Vec::new();
        for (batch, base) in self.batches_with_base() {
            let values = self
                .utf8_array(batch, node, buffer)
                .map_err(|r| self.col_err(column, r))?;
            for (i, v) in values.into_iter().enumerate() {
                out.push(v.ok_or_else(|| self.null_err(column, base + i))?);
            }
        }
        Ok(out)
    }

    /// A list<utf8> column; a null list or a null item is an error.
    pub fn list_utf8(&self, column: &str) -> Result<Vec<Vec<String>>, ArrowError> {
        let (field, node, buffer) = self.column(column)?;
        let item_is_utf8 = field.children.first().map(|c| c.data_type) == Some(DataType::Utf8);
        if field.data_type != DataType::List || !item_is_utf8 {
            return Err(self.wrong_type(field, "list<utf8>"));
        }
        let mut out = Vec::new();
        for (batch, base) in self.batches_with_base() {
            let (lists, items) = self
                .list_array(batch, node, buffer)
                .map_err(|r| self.col_err(column, r))?;
            let mut items: Vec<Option<String>> = items;
            for (i, list) in lists.into_iter().enumerate() {
                let Some(range) = list else {
                    return Err(self.null_err(column, base + i));
                };
                let mut row = Vec::with_capacity(range.len());
                for (k, item) in items[range].iter_mut().enumerate() {
                    match item.take() {
                        Some(s) => row.push(s),
                        None => {
                            return Err(
                                self.col_err(column, format!("row {} item {k} is null", base + i))
                            )
                        }
                    }
                }
                out.push(row);
            }
        }
        Ok(out)
    }

    /// A signed 64-bit integer column; a null is an error. Other widths and unsigned
    /// integers are refused rather than converted, so a schema change shows up here.
    pub fn int64(&self, column: &str) -> Result<Vec<i64>, ArrowError> {
        let (field, node, buffer) = self.column(column)?;
        let want = DataType::Int {
            bit_width: 64,
            signed: true,
        };
        if field.data_type != want {
            return Err(self.wrong_type(field, "int64"));
        }
        let mut out = Vec::new();
        for (batch, base) in self.batches_with_base() {
            let values = self
                .int64_array(batch, node, buffer)
                .map_err(|r| self.col_err(column, r))?;
            for (i, v) in values.into_iter().enumerate() {
                out.push(v.ok_or_else(|| self.null_err(column, base + i))?);
            }
        }
        Ok(out)
    }

    fn column(&self, name: &str) -> Result<(&Field, usize, usize), ArrowError> {
        let i = self
            .fields
            .iter()
            .position(|f| f.name == name)
            .ok_or_else(|| {
                let names: Vec<&str> = self.fields.iter().map(|f| f.name.as_str()).collect();
                self.col_err(
                    name,
                    format!("no such column; the table has: {}", names.join(", ")),
                )
            })?;
        let (node, buffer) = self.slots[i];
        Ok((&self.fields[i], node, buffer))
    }

    fn batches_with_base(&self) -> impl Iterator<Item = (&Batch, usize)> {
        self.batches.iter().scan(0usize, |base, b| {
            let here = *base;
            *base += b.rows;
            Some((b, here))
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
            &field.name,
            format!(
                "has type {}; this reader decodes it only as {want}",
                field.type_name()
            ),
        )
    }

    fn buffer(&self, batch: &Batch, i: usize) -> Res<&[u8]> {
        let r = batch
            .buffers
            .get(i)
            .ok_or_else(|| format!("buffer {i} is missing from the record batch"))?;
        self.bytes
            .get(r.clone())
            .ok_or_else(|| format!("buffer {i} lies outside the file"))
    }

    fn node(batch: &Batch, i: usize) -> Res<Node> {
        batch
            .nodes
            .get(i)
            .copied()
            .ok_or_else(|| format!("field node {i} is missing from the record batch"))
    }

    /// The validity bitmap, or None when every slot is valid. A writer may omit the
    /// bitmap (zero-length buffer) only when the null count is zero.
    fn validity(&self, batch: &Batch, node: Node, buffer: usize) -> Res<Option<&[u8]>> {
        let bits = self.buffer(batch, buffer)?;
        if bits.is_empty() {
            if node.null_count > 0 {
                return Err(format!(
                    "{} nulls but no validity bitmap (buffer {buffer})",
                    node.null_count
                ));
            }
            return Ok(None);
        }
        if bits.len() < node.length.div_ceil(8) {
            return Err(format!(
                "validity bitmap (buffer {buffer}) has {} bytes for {} rows",
                bits.len(),
                node.length
            ));
        }
        Ok(Some(bits))
    }

    /// `length + 1` non-decreasing, non-negative i32 offsets, none beyond `limit`.
    fn offsets(&self, batch: &Batch, node: Node, buffer: usize, limit: usize) -> Res<Vec<usize>> {
        if node.length == 0 {
            // The offsets buffer of an empty array may be empty.
            return Ok(vec![0]);
        }
        let raw = self.buffer(batch, buffer)?;
        let needed = node
            .length
            .checked_add(1)
            .and_then(|n| n.checked_mul(4))
            .ok_or_else(|| format!("row count {} overflows", node.length))?;
        if raw.len() < needed {
            return Err(format!(
                "offsets (buffer {buffer}) hold {} bytes; {} rows need {needed}",
                raw.len(),
                node.length
            ));
        }
        let mut out = Vec::with_capacity(node.length + 1);
        let mut prev = 0usize;
        for (i, c) in raw[..needed].chunks_exact(4).enumerate() {
            let v = i32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            let v = usize::try_from(v).map_err(|_| format!("offset {i} is negative ({v})"))?;
            if i > 0 && v < prev {
                return Err(format!("offset {i} ({v}) is below the one before ({prev})"));
            }
            if v > limit {
                return Err(format!(
                    "offset {i} ({v}) is past the end of its data ({limit})"
                ));
            }
            out.push(v);
            prev = v;
        }
        Ok(out)
    }

    fn utf8_array(&self, batch: &Batch, node: usize, buffer: usize) -> Res<Vec<Option<String>>> {
        let n = Self::node(batch, node)?;
        let valid = self.validity(batch, n, buffer)?;
        let data = self.buffer(batch, buffer + 2)?;
        let offsets = self.offsets(batch, n, buffer + 1, data.len())?;
        let mut out = Vec::with_capacity(n.length);
        for i in 0..n.length {
            if !is_valid(valid, i) {
                out.push(None);
                continue;
            }
            let s = std::str::from_utf8(&data[offsets[i]..offsets[i + 1]])
                .map_err(|e| format!("row {i} is not valid UTF-8: {e}"))?;
            out.push(Some(s.to_string()));
        }
        Ok(out)
    }

    /// Each list's range of items (None for a null list) and the items themselves.
    #[allow(clippy::type_complexity)]
    fn list_array(
        &self,
        batch: &Batch,
        node: usize,
        buffer: usize,
    ) -> Res<(Vec<Option<Range<usize>>>, Vec<Option<String>>)> {
        let n = Self::node(batch, node)?;
        let valid = self.validity(batch, n, buffer)?;
        // The item field follows its list depth-first: one node, then its buffers.
        let items = self.utf8_array(batch, node + 1, buffer + 2)?;
        let offsets = self.offsets(batch, n, buffer + 1, items.len())?;
        let lists = (0..n.length)
            .map(|i| {
                if !is_valid(valid, i) {
                    None
                } else {
                    Some(offsets[i]..offsets[i + 1])
                }
            })
            .collect();
        Ok((lists, items))
    }

    fn int64_array(&self, batch: &Batch, node: usize, buffer: usize) -> Res<Vec<Option<i64>>> {
        let n = Self::node(batch, node)?;
        let valid = self.validity(batch, n, buffer)?;
        let data = self.buffer(batch, buffer + 1)?;
        let needed = n
            .length
            .checked_mul(8)
            .ok_or_else(|| format!("row count {} overflows", n.length))?;
        if data.len() < needed {
            return Err(format!(
                "data (buffer {}) holds {} bytes; {} int64 rows need {needed}",
                buffer + 1,
                data.len(),
                n.length
            ));
        }
        Ok(data[..needed]
            .chunks_exact(8)
            .enumerate()
            .map(|(i, c)| {
                let v = i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
                is_valid(valid, i).then_some(v)
            })
            .collect())
    }
}

/// Whether slot `i` holds a value; no bitmap means every slot does. Arrow bitmaps number
/// bits from the least significant one.
fn is_valid(bitmap: Option<&[u8]>, i: usize) -> bool {
    bitmap.is_none_or(|bits| bits.get(i / 8).is_some_and(|b| b >> (i % 8) & 1 == 1))
}

#[cfg(test)]
mod tests {
    use super::ipc::*;
    use super::*;

    const FIXTURE: &[u8] = include_bytes!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/mmlu_abstract_algebra_dev.arrow"
    ));

    fn fixture_path() -> &'static Path {
        Path::new("mmlu_abstract_algebra_dev.arrow")
    }

    fn read(bytes: &[u8]) -> Result<ArrowTable, ArrowError> {
        ArrowTable::from_bytes(fixture_path(), bytes.to_vec())
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
        let names: Vec<_> = t.fields().iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["question", "subject", "choices", "answer"]);
        let types: Vec<_> = t.fields().iter().map(Field::type_name).collect();
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
        let e = t.utf8("nope").unwrap_err().to_string();
        assert!(e.contains("question, subject, choices, answer"), "{e}");
        assert!(e.contains("mmlu_abstract_algebra_dev.arrow"), "{e}");
    }

    /// Offsets where a message starts, plus the end: a stream cut there is complete as
    /// far as any reader can tell (writers may omit the end-of-stream marker).
    fn message_boundaries(bytes: &[u8]) -> Vec<usize> {
        let mut out = Vec::new();
        let mut pos = 0;
        while pos + 8 <= bytes.len() {
            out.push(pos);
            let meta = i32::from_le_bytes(bytes[pos + 4..pos + 8].try_into().unwrap());
            if meta == 0 {
                break;
            }
            // The body length is the message's field 3.
            let fb = Fb {
                buf: &bytes[pos + 8..pos + 8 + meta as usize],
            };
            let body = fb.root("m").unwrap().i64_or(3, 0).unwrap() as usize;
            pos += 8 + meta as usize + body;
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
        assert!(read(&[]).unwrap_err().to_string().contains("no schema"));
        let e = read(&FIXTURE[..FIXTURE.len() - 4]).unwrap_err().to_string();
        assert!(e.contains("truncated"), "{e}");
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

    // A small flatbuffer writer for hand-made streams. Children are placed after their
    // parent, so every u32 offset points forward as the format requires.
    enum V {
        U8(u8),
        I16(i16),
        I32(i32),
        I64(i64),
        Str(String),
        Table(Obj),
        Tables(Vec<Obj>),
        Pairs(Vec<(i64, i64)>),
    }

    struct Obj(Vec<(usize, V)>);

    fn put_table(out: &mut Vec<u8>, obj: &Obj) -> usize {
        let slots = obj.0.iter().map(|(i, _)| i + 1).max().unwrap_or(0);
        let mut inline = Vec::new();
        let mut offsets = vec![0u16; slots];
        let mut pending = Vec::new();
        for (i, v) in &obj.0 {
            offsets[*i] = (4 + inline.len()) as u16;
            match v {
                V::U8(x) => inline.push(*x),
                V::I16(x) => inline.extend(x.to_le_bytes()),
                V::I32(x) => inline.extend(x.to_le_bytes()),
                V::I64(x) => inline.extend(x.to_le_bytes()),
                _ => {
                    pending.push((inline.len(), v));
                    inline.extend([0u8; 4]);
                }
            }
        }
        let vt = out.len();
        out.extend(((4 + 2 * slots) as u16).to_le_bytes());
        out.extend(((4 + inline.len()) as u16).to_le_bytes());
        for o in offsets {
            out.extend(o.to_le_bytes());
        }
        let table = out.len();
        out.extend(((table - vt) as i32).to_le_bytes());
        out.extend(&inline);
        for (at, v) in pending {
            let slot = table + 4 + at;
            let target = out.len();
            match v {
                V::Str(s) => {
                    out.extend((s.len() as u32).to_le_bytes());
                    out.extend(s.as_bytes());
                    out.push(0);
                }
                V::Table(t) => {
                    let pos = put_table(out, t);
                    patch(out, slot, pos);
                    continue;
                }
                V::Tables(ts) => {
                    out.extend((ts.len() as u32).to_le_bytes());
                    let first = out.len();
                    out.extend(vec![0u8; 4 * ts.len()]);
                    for (k, t) in ts.iter().enumerate() {
                        let pos = put_table(out, t);
                        patch(out, first + 4 * k, pos);
                    }
                }
                V::Pairs(ps) => {
                    out.extend((ps.len() as u32).to_le_bytes());
                    for (a, b) in ps {
                        out.extend(a.to_le_bytes());
                        out.extend(b.to_le_bytes());
                    }
                }
                _ => unreachable!(),
            }
            patch(out, slot, target);
        }
        table
    }

    fn patch(out: &mut [u8], slot: usize, target: usize) {
        out[slot..slot + 4].copy_from_slice(&((target - slot) as u32).to_le_bytes());
    }

    fn message(header_type: u8, header: Obj, body: &[u8]) -> Vec<u8> {
        let msg = Obj(vec![
            (0, V::I16(4)),
            (1, V::U8(header_type)),
            (2, V::Table(header)),
            (3, V::I64(body.len() as i64)),
        ]);
        let mut meta = vec![0u8; 4];
        let root = put_table(&mut meta, &msg);
        patch(&mut meta, 0, root);
        while !meta.len().is_multiple_of(8) {
            meta.push(0);
        }
        let mut out = vec![0xff; 4];
        out.extend((meta.len() as i32).to_le_bytes());
        out.extend(meta);
        out.extend(body);
        out
    }

    fn field(name: &str, type_id: u8, ty: Obj, children: Vec<Obj>) -> Obj {
        Obj(vec![
            (0, V::Str(name.into())),
            (1, V::U8(1)),
            (2, V::U8(type_id)),
            (3, V::Table(ty)),
            (5, V::Tables(children)),
        ])
    }

    fn int(name: &str, bits: i32, signed: bool) -> Obj {
        field(
            name,
            TYPE_INT,
            Obj(vec![(0, V::I32(bits)), (1, V::U8(signed as u8))]),
            vec![],
        )
    }

    fn schema(fields: Vec<Obj>) -> Vec<u8> {
        message(HEADER_SCHEMA, Obj(vec![(1, V::Tables(fields))]), &[])
    }

    /// A column's nodes and buffers, depth-first.
    type Col = (Vec<(i64, i64)>, Vec<Vec<u8>>);

    fn validity(valid: &[bool]) -> Vec<u8> {
        if valid.iter().all(|v| *v) {
            return Vec::new();
        }
        let mut bits = vec![0u8; valid.len().div_ceil(8)];
        for (i, v) in valid.iter().enumerate() {
            if *v {
                bits[i / 8] |= 1 << (i % 8);
            }
        }
        bits
    }

    fn nulls(valid: &[bool]) -> i64 {
        valid.iter().filter(|v| !**v).count() as i64
    }

    fn utf8_col(vals: &[Option<&str>]) -> Col {
        let valid: Vec<bool> = vals.iter().map(Option::is_some).collect();
        let mut offsets = vec![0i32];
        let mut data = Vec::new();
        for v in vals {
            data.extend(v.unwrap_or("").as_bytes());
            offsets.push(data.len() as i32);
        }
        let offsets = offsets.iter().flat_map(|o| o.to_le_bytes()).collect();
        (
            vec![(vals.len() as i64, nulls(&valid))],
            vec![validity(&valid), offsets, data],
        )
    }

    fn int64_col(vals: &[Option<i64>]) -> Col {
        let valid: Vec<bool> = vals.iter().map(Option::is_some).collect();
        let data = vals
            .iter()
            .flat_map(|v| v.unwrap_or(0).to_le_bytes())
            .collect();
        (
            vec![(vals.len() as i64, nulls(&valid))],
            vec![validity(&valid), data],
        )
    }

    fn list_col(vals: &[Option<Vec<Option<&str>>>]) -> Col {
        let valid: Vec<bool> = vals.iter().map(Option::is_some).collect();
        let mut offsets = vec![0i32];
        let mut items = Vec::new();
        for v in vals {
            items.extend(v.clone().unwrap_or_default());
            offsets.push(items.len() as i32);
        }
        let (child_nodes, child_bufs) = utf8_col(&items);
        let mut nodes = vec![(vals.len() as i64, nulls(&valid))];
        nodes.extend(child_nodes);
        let mut bufs = vec![
            validity(&valid),
            offsets.iter().flat_map(|o| o.to_le_bytes()).collect(),
        ];
        bufs.extend(child_bufs);
        (nodes, bufs)
    }

    fn batch(rows: i64, cols: Vec<Col>, compressed: bool) -> Vec<u8> {
        let mut nodes = Vec::new();
        let mut buffers = Vec::new();
        let mut body = Vec::new();
        for (n, bufs) in cols {
            nodes.extend(n);
            for b in bufs {
                buffers.push((body.len() as i64, b.len() as i64));
                body.extend(&b);
                while !body.len().is_multiple_of(8) {
                    body.push(0);
                }
            }
        }
        let mut header = vec![
            (0, V::I64(rows)),
            (1, V::Pairs(nodes)),
            (2, V::Pairs(buffers)),
        ];
        if compressed {
            header.push((3, V::Table(Obj(vec![(0, V::U8(1))]))));
        }
        message(HEADER_RECORD_BATCH, Obj(header), &body)
    }

    const EOS: [u8; 8] = [0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0];

    fn mmlu_schema() -> Vec<u8> {
        schema(vec![
            field("question", TYPE_UTF8, Obj(vec![]), vec![]),
            field(
                "choices",
                TYPE_LIST,
                Obj(vec![]),
                vec![field("item", TYPE_UTF8, Obj(vec![]), vec![])],
            ),
            int("answer", 64, true),
        ])
    }

    fn mmlu_batch(
        q: &[Option<&str>],
        c: &[Option<Vec<Option<&str>>>],
        a: &[Option<i64>],
    ) -> Vec<u8> {
        batch(
            q.len() as i64,
            vec![utf8_col(q), list_col(c), int64_col(a)],
            false,
        )
    }

    #[test]
    fn batches_are_concatenated_with_or_without_the_end_marker() {
        let mut s = mmlu_schema();
        s.extend(mmlu_batch(
            &[Some("q0"), Some("q1")],
            &[Some(vec![Some("a"), Some("b")]), Some(vec![])],
            &[Some(0), Some(-7)],
        ));
        s.extend(mmlu_batch(
            &[Some(" q2 ")],
            &[Some(vec![Some("c"), Some("dé"), Some("")])],
            &[Some(i64::MAX)],
        ));
        let check = |bytes: &[u8]| {
            let t = read(bytes).unwrap();
            assert_eq!(t.num_rows(), 3);
            assert_eq!(t.utf8("question").unwrap(), ["q0", "q1", " q2 "]);
            let c = t.list_utf8("choices").unwrap();
            assert_eq!(c, vec![vec!["a", "b"], vec![], vec!["c", "dé", ""]]);
            assert_eq!(t.int64("answer").unwrap(), [0, -7, i64::MAX]);
        };
        check(&s);
        s.extend(EOS);
        check(&s);
        // Anything after the end marker is not part of the stream.
        s.extend([1, 2, 3]);
        check(&s);
    }

    #[test]
    fn a_null_names_the_column_and_the_row_across_batches() {
        let mut s = mmlu_schema();
        s.extend(mmlu_batch(
            &[Some("q0")],
            &[Some(vec![Some("a")])],
            &[Some(0)],
        ));
        s.extend(mmlu_batch(
            &[Some("q1"), None],
            &[Some(vec![Some("a"), None]), None],
            &[Some(1), None],
        ));
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
    }

    #[test]
    fn unsupported_types_and_features_give_clear_errors() {
        for (bits, signed, name) in [
            (64, false, "uint64"),
            (32, true, "int32"),
            (8, false, "uint8"),
        ] {
            let mut s = schema(vec![int("answer", bits, signed)]);
            s.extend(batch(1, vec![int64_col(&[Some(1)])], false));
            // The data buffer of int64_col is wide enough for every width here.
            let t = read(&s).unwrap();
            let e = t.int64("answer").unwrap_err().to_string();
            assert!(e.contains(&format!("has type {name}")), "{e}");
        }

        let mut s = schema(vec![
            field("big", TYPE_LARGE_UTF8, Obj(vec![]), vec![]),
            field("q", TYPE_UTF8, Obj(vec![]), vec![]),
        ]);
        s.extend(batch(
            1,
            vec![utf8_col(&[Some("x")]), utf8_col(&[Some("y")])],
            false,
        ));
        let t = read(&s).unwrap();
        // A column of an unsupported type is stepped over, not misread.
        assert_eq!(t.utf8("q").unwrap(), ["y"]);
        let e = t.utf8("big").unwrap_err().to_string();
        assert!(e.contains("has type large_utf8"), "{e}");

        let mut s = mmlu_schema();
        s.extend(batch(0, vec![], true));
        let e = read(&s).unwrap_err().to_string();
        assert!(e.contains("compressed with Zstandard"), "{e}");

        let mut s = mmlu_schema();
        s.extend(message(HEADER_DICTIONARY_BATCH, Obj(vec![]), &[]));
        let e = read(&s).unwrap_err().to_string();
        assert!(e.contains("dictionary batch"), "{e}");

        let s = schema(vec![field("u", 14, Obj(vec![]), vec![])]);
        let e = read(&s).unwrap_err().to_string();
        assert!(e.contains("union"), "{e}");

        let s = message(
            HEADER_SCHEMA,
            Obj(vec![(0, V::I16(1)), (1, V::Tables(vec![]))]),
            &[],
        );
        let e = read(&s).unwrap_err().to_string();
        assert!(e.contains("big-endian"), "{e}");
    }

    #[test]
    fn buffers_and_offsets_outside_their_bounds_are_errors() {
        // A batch whose node count disagrees with the schema.
        let mut s = mmlu_schema();
        s.extend(batch(1, vec![utf8_col(&[Some("q")])], false));
        let e = read(&s).unwrap_err().to_string();
        assert!(e.contains("the schema needs 4 and"), "{e}");

        // Offsets that run past the string data.
        let mut s = schema(vec![field("q", TYPE_UTF8, Obj(vec![]), vec![])]);
        let (nodes, mut bufs) = utf8_col(&[Some("abc")]);
        bufs[1] = [0i32, 9].iter().flat_map(|o| o.to_le_bytes()).collect();
        s.extend(batch(1, vec![(nodes, bufs)], false));
        let e = read(&s).unwrap().utf8("q").unwrap_err().to_string();
        assert!(e.contains("past the end of its data"), "{e}");

        // Decreasing offsets.
        let mut s = schema(vec![field("q", TYPE_UTF8, Obj(vec![]), vec![])]);
        let (nodes, mut bufs) = utf8_col(&[Some("ab"), Some("c")]);
        bufs[1] = [0i32, 2, 1].iter().flat_map(|o| o.to_le_bytes()).collect();
        s.extend(batch(2, vec![(nodes, bufs)], false));
        let e = read(&s).unwrap().utf8("q").unwrap_err().to_string();
        assert!(e.contains("below the one before"), "{e}");

        // A top-level column shorter than its batch.
        let mut s = schema(vec![int("a", 64, true)]);
        s.extend(batch(3, vec![int64_col(&[Some(1)])], false));
        let e = read(&s).unwrap_err().to_string();
        assert!(e.contains("has 1 rows in a record batch of 3"), "{e}");

        // Invalid UTF-8.
        let mut s = schema(vec![field("q", TYPE_UTF8, Obj(vec![]), vec![])]);
        let (nodes, mut bufs) = utf8_col(&[Some("ab")]);
        bufs[2] = vec![0xc3, 0x28];
        s.extend(batch(1, vec![(nodes, bufs)], false));
        let e = read(&s).unwrap().utf8("q").unwrap_err().to_string();
        assert!(e.contains("not valid UTF-8"), "{e}");
    }
}
