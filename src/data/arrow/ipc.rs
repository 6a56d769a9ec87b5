//! The IPC stream's framing and its flatbuffer metadata (schema and record batch headers),
//! read by hand. Every offset is checked against the bytes it points into.

use super::{Batch, DataType, Field, Node, Res};
use std::ops::Range;

// Ids in Arrow's `Type` union (Schema.fbs).
pub(super) const TYPE_NULL: u8 = 1;
pub(super) const TYPE_INT: u8 = 2;
pub(super) const TYPE_UTF8: u8 = 5;
pub(super) const TYPE_LIST: u8 = 12;
pub(super) const TYPE_LARGE_UTF8: u8 = 20;

// Ids in the `MessageHeader` union (Message.fbs).
pub(super) const HEADER_SCHEMA: u8 = 1;
pub(super) const HEADER_DICTIONARY_BATCH: u8 = 2;
pub(super) const HEADER_RECORD_BATCH: u8 = 3;

/// `MetadataVersion.V4`: the first with the layout read here (V5 only changed unions).
pub(super) const METADATA_V4: i16 = 3;

/// Deeper nesting than any real schema; it bounds recursion on a hostile file whose
/// child offsets loop back.
pub(super) const MAX_DEPTH: usize = 32;

pub(super) fn type_id(t: DataType) -> u8 {
    match t {
        DataType::Int { .. } => TYPE_INT,
        DataType::Utf8 => TYPE_UTF8,
        DataType::LargeUtf8 => TYPE_LARGE_UTF8,
        DataType::List => TYPE_LIST,
        DataType::Other(id) => id,
    }
}

pub(super) fn type_id_name(id: u8) -> &'static str {
    match id {
        1 => "null",
        2 => "int",
        3 => "floating point",
        4 => "binary",
        5 => "utf8",
        6 => "bool",
        7 => "decimal",
        8 => "date",
        9 => "time",
        10 => "timestamp",
        11 => "interval",
        12 => "list",
        13 => "struct",
        14 => "union",
        15 => "fixed-size binary",
        16 => "fixed-size list",
        17 => "map",
        18 => "duration",
        19 => "large binary",
        20 => "large_utf8",
        21 => "large list",
        22 => "run-end encoded",
        23 => "binary view",
        24 => "utf8 view",
        25 => "list view",
        26 => "large list view",
        _ => "unknown type",
    }
}

/// Buffers one node of this type has in a record batch, children not counted; None for
/// types whose layout is not a fixed count (unions, views) or is unknown. Without the
/// count, the buffers of every later column could not be located.
pub(super) fn own_buffers(id: u8) -> Option<usize> {
    match id {
        TYPE_NULL | 22 => Some(0),
        13 | 16 => Some(1),
        2 | 3 | 6..=12 | 15 | 17 | 18 | 21 => Some(2),
        4 | 5 | 19 | 20 => Some(3),
        _ => None,
    }
}

/// Bounds-checked access to one flatbuffer.
#[derive(Clone, Copy)]
pub(super) struct Fb<'a> {
    pub(super) buf: &'a [u8],
}

impl<'a> Fb<'a> {
    pub(super) fn bytes<const N: usize>(&self, pos: usize, what: &str) -> Res<[u8; N]> {
        pos.checked_add(N)
            .and_then(|end| self.buf.get(pos..end))
            .and_then(|s| s.try_into().ok())
            .ok_or_else(|| {
                format!(
                    "{what} at metadata byte {pos} is past the end of the {}-byte metadata",
                    self.buf.len()
                )
            })
    }

    pub(super) fn u16(&self, pos: usize, what: &str) -> Res<u16> {
        self.bytes(pos, what).map(u16::from_le_bytes)
    }

    pub(super) fn u32(&self, pos: usize, what: &str) -> Res<u32> {
        self.bytes(pos, what).map(u32::from_le_bytes)
    }

    pub(super) fn i64(&self, pos: usize, what: &str) -> Res<i64> {
        self.bytes(pos, what).map(i64::from_le_bytes)
    }

    /// Follows the u32 offset stored at `pos`, which is relative to `pos` itself.
    pub(super) fn follow(&self, pos: usize, what: &str) -> Res<usize> {
        let off = self.u32(pos, what)? as usize;
        pos.checked_add(off)
            .filter(|&p| p < self.buf.len())
            .ok_or_else(|| format!("{what} points past the end of the metadata"))
    }

    pub(super) fn root(&self, what: &str) -> Res<Table<'a>> {
        self.table(self.follow(0, what)?, what)
    }

    pub(super) fn table(&self, pos: usize, what: &str) -> Res<Table<'a>> {
        let soffset = i32::from_le_bytes(self.bytes(pos, what)?);
        let vt = i64::try_from(pos)
            .ok()
            .and_then(|p| p.checked_sub(i64::from(soffset)))
            .and_then(|v| usize::try_from(v).ok())
            .ok_or_else(|| {
                format!("{what}: vtable offset {soffset} points outside the metadata")
            })?;
        let vt_len = self.u16(vt, what)? as usize;
        let table_len = self.u16(vt + 2, what)? as usize;
        if vt_len < 4 || !vt_len.is_multiple_of(2) || table_len < 4 {
            return Err(format!(
                "{what}: malformed vtable (lengths {vt_len} and {table_len})"
            ));
        }
        let in_buf = |start: usize, len: usize| {
            start
                .checked_add(len)
                .is_some_and(|end| end <= self.buf.len())
        };
        if !in_buf(vt, vt_len) || !in_buf(pos, table_len) {
            return Err(format!("{what}: table runs past the end of the metadata"));
        }
        Ok(Table {
            fb: *self,
            pos,
            vt,
            vt_len,
            table_len,
            what: what.to_string(),
        })
    }
}

pub(super) struct Table<'a> {
    fb: Fb<'a>,
    pos: usize,
    vt: usize,
    vt_len: usize,
    table_len: usize,
    what: String,
}

impl<'a> Table<'a> {
    /// Where field `i` (of `size` bytes) lies, or None when the writer left it out (a
    /// default value, or a newer field than the writer knew).
    pub(super) fn field(&self, i: usize, size: usize) -> Res<Option<usize>> {
        let slot = 4 + 2 * i;
        if slot + 2 > self.vt_len {
            return Ok(None);
        }
        let off = self.fb.u16(self.vt + slot, &self.what)? as usize;
        if off == 0 {
            return Ok(None);
        }
        if off < 4 || off + size > self.table_len {
            return Err(format!("{}: field {i} lies outside its table", self.what));
        }
        Ok(Some(self.pos + off))
    }

    pub(super) fn u8_or(&self, i: usize, default: u8) -> Res<u8> {
        Ok(match self.field(i, 1)? {
            Some(p) => self.fb.bytes::<1>(p, &self.what)?[0],
            None => default,
        })
    }

    pub(super) fn i16_or(&self, i: usize, default: i16) -> Res<i16> {
        Ok(match self.field(i, 2)? {
            Some(p) => i16::from_le_bytes(self.fb.bytes(p, &self.what)?),
            None => default,
        })
    }

    pub(super) fn i32_or(&self, i: usize, default: i32) -> Res<i32> {
        Ok(match self.field(i, 4)? {
            Some(p) => i32::from_le_bytes(self.fb.bytes(p, &self.what)?),
            None => default,
        })
    }

    pub(super) fn i64_or(&self, i: usize, default: i64) -> Res<i64> {
        Ok(match self.field(i, 8)? {
            Some(p) => self.fb.i64(p, &self.what)?,
            None => default,
        })
    }

    pub(super) fn table(&self, i: usize, what: &str) -> Res<Option<Table<'a>>> {
        match self.field(i, 4)? {
            Some(p) => {
                let t = self.fb.follow(p, what)?;
                self.fb.table(t, what).map(Some)
            }
            None => Ok(None),
        }
    }

    pub(super) fn string(&self, i: usize, what: &str) -> Res<Option<&'a str>> {
        let Some((start, len)) = self.vector(i, 1, what)? else {
            return Ok(None);
        };
        std::str::from_utf8(&self.fb.buf[start..start + len])
            .map(Some)
            .map_err(|e| format!("{what} is not valid UTF-8: {e}"))
    }

    /// Start and element count of a vector field whose elements are `elem` bytes each,
    /// checked to fit in the metadata.
    pub(super) fn vector(&self, i: usize, elem: usize, what: &str) -> Res<Option<(usize, usize)>> {
        let Some(p) = self.field(i, 4)? else {
            return Ok(None);
        };
        let v = self.fb.follow(p, what)?;
        let len = self.fb.u32(v, what)? as usize;
        let start = v + 4;
        let fits = len
            .checked_mul(elem)
            .and_then(|bytes| start.checked_add(bytes))
            .is_some_and(|end| end <= self.fb.buf.len());
        if !fits {
            return Err(format!(
                "{what}: vector of {len} elements runs past the end of the metadata"
            ));
        }
        Ok(Some((start, len)))
    }

    pub(super) fn tables(&self, i: usize, what: &str) -> Res<Vec<Table<'a>>> {
        let Some((start, len)) = self.vector(i, 4, what)? else {
            return Ok(Vec::new());
        };
        (0..len)
            .map(|k| {
                let pos = self.fb.follow(start + 4 * k, what)?;
                self.fb.table(pos, what)
            })
            .collect()
    }

    /// A vector of structs of two i64 (`FieldNode` and `Buffer` both are).
    pub(super) fn i64_pairs(&self, i: usize, what: &str) -> Res<Vec<(i64, i64)>> {
        let Some((start, len)) = self.vector(i, 16, what)? else {
            return Ok(Vec::new());
        };
        (0..len)
            .map(|k| {
                let p = start + 16 * k;
                Ok((self.fb.i64(p, what)?, self.fb.i64(p + 8, what)?))
            })
            .collect()
    }
}

fn parse_field(t: &Table, depth: usize) -> Res<Field> {
    if depth > MAX_DEPTH {
        return Err(format!("fields nest deeper than {MAX_DEPTH} levels"));
    }
    let name = t.string(0, "field name")?.unwrap_or("").to_string();
    let nullable = t.u8_or(1, 0)? != 0;
    let id = t.u8_or(2, 0)?;
    if t.field(4, 4)?.is_some() {
        return Err(format!(
            "field `{name}` is dictionary-encoded, which this reader does not decode"
        ));
    }
    let type_table = t.table(3, "field type")?;
    let data_type = match id {
        TYPE_INT => {
            let (bit_width, signed) = match &type_table {
                Some(tt) => (tt.i32_or(0, 0)?, tt.u8_or(1, 0)? != 0),
                None => (0, false),
            };
            if ![8, 16, 32, 64].contains(&bit_width) {
                return Err(format!("field `{name}` is an integer of {bit_width} bits"));
            }
            DataType::Int { bit_width, signed }
        }
        TYPE_UTF8 => DataType::Utf8,
        TYPE_LARGE_UTF8 => DataType::LargeUtf8,
        TYPE_LIST => DataType::List,
        other if own_buffers(other).is_some() => DataType::Other(other),
        other => {
            return Err(format!(
                "field `{name}` has type {} (Arrow type id {other}), whose buffers this \
                 reader cannot step over",
                type_id_name(other)
            ))
        }
    };
    let children = t
        .tables(5, "field children")?
        .iter()
        .map(|c| parse_field(c, depth + 1))
        .collect::<Res<Vec<_>>>()?;
    if data_type == DataType::List && children.len() != 1 {
        return Err(format!(
            "list field `{name}` has {} child fields instead of one",
            children.len()
        ));
    }
    Ok(Field {
        name,
        data_type,
        nullable,
        children,
    })
}

fn parse_schema(header: &Table) -> Res<Vec<Field>> {
    if header.i16_or(0, 0)? != 0 {
        return Err("the data is big-endian; this reader reads little-endian only".into());
    }
    header
        .tables(1, "schema fields")?
        .iter()
        .map(|f| parse_field(f, 0))
        .collect()
}

fn to_usize(v: i64, what: &str) -> Res<usize> {
    usize::try_from(v).map_err(|_| format!("{what} is negative or too large ({v})"))
}

/// One record batch; `body` is the absolute range of its body in the stream.
fn parse_batch(header: &Table, fields: &[Field], body: Range<usize>) -> Res<Batch> {
    if let Some(c) = header.table(3, "batch compression")? {
        let codec = match c.u8_or(0, 0)? {
            0 => "LZ4 frame",
            1 => "Zstandard",
            _ => "an unknown codec",
        };
        return Err(format!(
            "a record batch is compressed with {codec}; this reader reads uncompressed \
             streams only"
        ));
    }
    let rows = to_usize(header.i64_or(0, 0)?, "record batch length")?;
    let nodes = header
        .i64_pairs(1, "record batch nodes")?
        .into_iter()
        .map(|(length, nulls)| {
            let node = Node {
                length: to_usize(length, "node length")?,
                null_count: to_usize(nulls, "node null count")?,
            };
            if node.null_count > node.length {
                return Err(format!(
                    "a node has {} nulls in {} rows",
                    node.null_count, node.length
                ));
            }
            Ok(node)
        })
        .collect::<Res<Vec<_>>>()?;
    let body_len = body.len();
    let buffers = header
        .i64_pairs(2, "record batch buffers")?
        .into_iter()
        .enumerate()
        .map(|(i, (offset, length))| {
            let start = to_usize(offset, "buffer offset")?;
            let len = to_usize(length, "buffer length")?;
            match start.checked_add(len) {
                Some(end) if end <= body_len => Ok(body.start + start..body.start + end),
                _ => Err(format!(
                    "buffer {i} ({len} bytes at {start}) runs past the {body_len}-byte body"
                )),
            }
        })
        .collect::<Res<Vec<_>>>()?;
    let want_nodes: usize = fields.iter().map(Field::node_count).sum();
    let want_buffers: usize = fields.iter().map(Field::buffer_count).sum();
    if nodes.len() != want_nodes || buffers.len() != want_buffers {
        return Err(format!(
            "a record batch has {} nodes and {} buffers; the schema needs {want_nodes} and \
             {want_buffers}",
            nodes.len(),
            buffers.len()
        ));
    }
    let mut node = 0;
    for f in fields {
        if nodes[node].length != rows {
            return Err(format!(
                "column `{}` has {} rows in a record batch of {rows}",
                f.name, nodes[node].length
            ));
        }
        node += f.node_count();
    }
    Ok(Batch {
        rows,
        nodes,
        buffers,
    })
}

/// Reads `N` bytes at `pos` of the stream, or says the file ends early.
fn stream_bytes<const N: usize>(bytes: &[u8], pos: usize, what: &str) -> Res<[u8; N]> {
    pos.checked_add(N)
        .and_then(|end| bytes.get(pos..end))
        .and_then(|s| s.try_into().ok())
        .ok_or_else(|| {
            format!(
                "the file ends at byte {} inside the {what} at byte {pos} (truncated?)",
                bytes.len()
            )
        })
}

pub(super) fn parse_stream(bytes: &[u8]) -> Res<(Vec<Field>, Vec<Batch>)> {
    let mut schema: Option<Vec<Field>> = None;
    let mut batches = Vec::new();
    let mut pos = 0usize;
    // A stream ends with the end-of-stream marker or, from writers that omit it, at the
    // end of the file between two messages.
    while pos < bytes.len() {
        let start = pos;
        let mut len = i32::from_le_bytes(stream_bytes(bytes, pos, "message length")?);
        pos += 4;
        // Since format 0.15 a message starts with 0xFFFFFFFF before its length; older
        // writers put the length first.
        if len == -1 {
            len = i32::from_le_bytes(stream_bytes(bytes, pos, "message length")?);
            pos += 4;
        }
        if len == 0 {
            break;
        }
        let len = usize::try_from(len)
            .map_err(|_| format!("message at byte {start} has a negative length ({len})"))?;
        let meta = pos
            .checked_add(len)
            .and_then(|end| bytes.get(pos..end))
            .ok_or_else(|| {
                format!(
                    "the file ends at byte {} inside the {len}-byte metadata of the message at \
                     byte {start} (truncated?)",
                    bytes.len()
                )
            })?;
        pos += len;
        let fb = Fb { buf: meta };
        let what = format!("message at byte {start}");
        let message = fb.root(&what)?;
        let version = message.i16_or(0, 0)?;
        if version < METADATA_V4 {
            return Err(format!(
                "{what} has metadata version V{}; this reader needs V4 or later",
                i32::from(version) + 1
            ));
        }
        let header_type = message.u8_or(1, 0)?;
        let header = message
            .table(2, &what)?
            .ok_or_else(|| format!("{what} has no header"))?;
        let body_len = to_usize(message.i64_or(3, 0)?, "body length")?;
        let body = pos
            .checked_add(body_len)
            .filter(|&end| end <= bytes.len())
            .map(|end| pos..end)
            .ok_or_else(|| {
                format!(
                    "the file ends at byte {} inside the {body_len}-byte body of the message \
                     at byte {start} (truncated?)",
                    bytes.len()
                )
            })?;
        pos = body.end;
        match (header_type, &schema) {
            (HEADER_SCHEMA, None) => schema = Some(parse_schema(&header)?),
            (HEADER_SCHEMA, Some(_)) => return Err(format!("{what} is a second schema")),
            (HEADER_RECORD_BATCH, Some(fields)) => {
                batches.push(parse_batch(&header, fields, body)?)
            }
            (HEADER_RECORD_BATCH | HEADER_DICTIONARY_BATCH, None) => {
                return Err(format!("{what} comes before the schema"))
            }
            (HEADER_DICTIONARY_BATCH, Some(_)) => {
                return Err(format!(
                    "{what} is a dictionary batch, which this reader does not decode"
                ))
            }
            (other, _) => {
                return Err(format!(
                    "{what} has header type {other}, not a schema or record batch"
                ))
            }
        }
    }
    let fields = schema.ok_or("the stream holds no schema message")?;
    let rows = batches
        .iter()
        .try_fold(0usize, |acc, b| acc.checked_add(b.rows));
    if rows.is_none() {
        return Err("the row count overflows".into());
    }
    Ok((fields, batches))
}
