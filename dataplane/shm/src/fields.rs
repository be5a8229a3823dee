//! A slot's small fields (text, JSON, `.npy`, bytes): the block stored right after the
//! image payload, `fields_len` bytes long (see "Fields" in `DESIGN.md`).
//!
//! ```text
//! block  := count: u16, then `count` entries
//! entry  := kind: u8, flags: u8, name_len: u8, 0: u8, value_len: u32, name, value
//! ```
//! Little-endian; no padding. `kind`: 3 text (UTF-8), 4 json (a JSON document), 5 npy (an
//! `.npy` file), 6 bytes. `flags` bit 0: the field declares a fixed shape (`npy`: every value
//! has it, clients stack them). The server checks the values when it loads the element; the
//! client still parses the block as untrusted bytes.

use crate::error::{Error, Result};

/// What a field's value is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FieldKind {
    /// UTF-8 text.
    Text = 3,
    /// A JSON document.
    Json = 4,
    /// An `.npy` file (its header checked by the server).
    Npy = 5,
    /// Bytes passed through.
    Bytes = 6,
}

impl FieldKind {
    fn of(code: u8) -> Option<Self> {
        Some(match code {
            3 => FieldKind::Text,
            4 => FieldKind::Json,
            5 => FieldKind::Npy,
            6 => FieldKind::Bytes,
            _ => return None,
        })
    }

    /// The kind's name, as sources declare it.
    pub fn name(self) -> &'static str {
        match self {
            FieldKind::Text => "text",
            FieldKind::Json => "json",
            FieldKind::Npy => "npy",
            FieldKind::Bytes => "bytes",
        }
    }
}

/// `flags` bit 0: the field has a fixed shape.
pub const FIXED_SHAPE: u8 = 1;

/// One field of an element, borrowed from its block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field<'a> {
    /// The field's name, as the dataset declares it.
    pub name: &'a str,
    /// What its value is.
    pub kind: FieldKind,
    /// Bit 0: [`FIXED_SHAPE`].
    pub flags: u8,
    /// The value's bytes.
    pub value: &'a [u8],
}

const ENTRY_HEAD: usize = 8;

/// Appends the block of `fields` to `out`.
///
/// Panics if a name is longer than 255 bytes or a value than `u32::MAX`, or there are more
/// than `u16::MAX` fields: the server's declarations never allow that.
pub fn encode(fields: &[Field<'_>], out: &mut Vec<u8>) {
    out.extend_from_slice(
        &u16::try_from(fields.len())
            .expect("few fields")
            .to_le_bytes(),
    );
    for f in fields {
        out.push(f.kind as u8);
        out.push(f.flags);
        out.push(u8::try_from(f.name.len()).expect("a short field name"));
        out.push(0);
        let len = u32::try_from(f.value.len()).expect("a field under 4 GiB");
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(f.name.as_bytes());
        out.extend_from_slice(f.value);
    }
}

/// The length of the block [`encode`] writes for `fields`.
pub fn encoded_len(fields: &[Field<'_>]) -> usize {
    2 + fields
        .iter()
        .map(|f| ENTRY_HEAD + f.name.len() + f.value.len())
        .sum::<usize>()
}

/// Parses a block (empty: no field). A block that does not parse is `segment_corrupt`.
pub fn parse(block: &[u8]) -> Result<Vec<Field<'_>>> {
    if block.is_empty() {
        return Ok(Vec::new());
    }
    let bad = |why: &str| Error::Corrupt {
        name: "data".into(),
        reason: format!("a slot's field block: {why}"),
    };
    let take = |at: &mut usize, n: usize| -> Result<&[u8]> {
        let end = at.checked_add(n).filter(|&e| e <= block.len());
        let s = end
            .map(|e| &block[*at..e])
            .ok_or_else(|| bad("it runs past its end"))?;
        *at += n;
        Ok(s)
    };
    let mut at = 0;
    let count = u16::from_le_bytes(take(&mut at, 2)?.try_into().expect("2 bytes"));
    let mut out = Vec::with_capacity(usize::from(count));
    for _ in 0..count {
        let head = take(&mut at, ENTRY_HEAD)?;
        let kind = FieldKind::of(head[0]).ok_or_else(|| bad("an unknown field kind"))?;
        if head[3] != 0 {
            return Err(bad("a reserved byte is not zero"));
        }
        let value_len = u32::from_le_bytes(head[4..8].try_into().expect("4 bytes")) as usize;
        let name = std::str::from_utf8(take(&mut at, usize::from(head[2]))?)
            .map_err(|_| bad("a field name is not UTF-8"))?;
        let value = take(&mut at, value_len)?;
        out.push(Field {
            name,
            kind,
            flags: head[1],
            value,
        });
    }
    if at != block.len() {
        return Err(bad("bytes after its last field"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_damage() {
        let fields = [
            Field {
                name: "caption",
                kind: FieldKind::Text,
                flags: 0,
                value: "un chat".as_bytes(),
            },
            Field {
                name: "emb",
                kind: FieldKind::Npy,
                flags: FIXED_SHAPE,
                value: &[1, 2, 3],
            },
        ];
        let mut block = Vec::new();
        encode(&fields, &mut block);
        assert_eq!(block.len(), encoded_len(&fields));
        assert_eq!(parse(&block).unwrap(), fields);
        assert!(parse(&[]).unwrap().is_empty());
        for cut in 1..block.len() {
            assert_eq!(parse(&block[..cut]).unwrap_err().code(), "segment_corrupt");
        }
        let mut longer = block.clone();
        longer.push(0);
        assert!(parse(&longer).is_err());
        let mut unknown = block.clone();
        unknown[2] = 9;
        assert!(parse(&unknown).is_err());
    }
}
