//! A `parquet` row's small fields (`text`, `json`, `npy`, `bytes`), each from a top-level
//! column of the file:
//!
//! - a binary or string column (not repeated) gives its value's bytes: the text, a JSON
//!   document written as text, an `.npy` file, or bytes;
//! - any other column gives a `json` field the column's value as JSON (a struct as an object,
//!   a list as an array: Hugging Face's `objects` or `Sequence` features), and an `npy` field
//!   a (nested) list of numbers as an array: its shape from the lists' lengths (ragged lists
//!   are the element's error), its dtype from the column's leaf (`float32` for `float`,
//!   `float64`, `int32`, `int64`), e.g. `objects.bbox` as `list<list<float>>` gives
//!   `(n, 4)` float32.
//!
//! The columns are checked when the dataset is indexed (present in every file, of a shape
//! the field's kind can take); a null value is the element's error when it is read. A value
//! is read from the row group's values of its column: the first read of a row of the group
//! reads the column's values of all its rows (a binary column with the crate's column reader,
//! in one pass over its pages; any other assembled with its record reader) and keeps them in
//! the dataset's read state (`reader.rs`, `FIELDS_BUDGET`, the oldest dropped first), so that
//! the group's other rows cost a lookup instead of reading or assembling every row before
//! theirs again.

use std::sync::Arc;

use parquet::basic::Type as PhysicalType;
use parquet::file::metadata::page_index::RowGroupPageIndex;
use parquet::file::properties::ReaderProperties;
use parquet::file::serialized_reader::SerializedRowGroupReader;
use parquet::record::reader::RowIter;
use parquet::record::{Field, Row};
use parquet::schema::types::{SchemaDescriptor, Type};

use super::super::fields::{FieldKind, FieldSpec, Fields};
use super::input::OpenFile;
use super::reader::{FieldValuesOfGroup, Reader};
use super::{chunk_range, read_cells};
use crate::fields::FieldValues;

/// Where a small field's values are in a file.
#[derive(Clone, Debug)]
pub(super) enum Column {
    /// A binary or string leaf (its number): the value's bytes.
    Binary(usize),
    /// Any other top-level column: assembled as a record. `dtype`: its leaf's, when it is a
    /// number; `depth`: the lists it is nested in (an empty list's array keeps that many
    /// dimensions).
    Record {
        name: String,
        dtype: Option<&'static str>,
        depth: usize,
    },
}

/// The column of each small field of `fields` (name order) in a file's schema, checked
/// against the field's kind; the error names the field.
pub(super) fn columns(schema: &SchemaDescriptor, fields: &Fields) -> Result<Vec<Column>, String> {
    fields
        .small()
        .map(|(name, spec)| column(schema, name, spec))
        .collect()
}

fn column(schema: &SchemaDescriptor, name: &str, spec: &FieldSpec) -> Result<Column, String> {
    let from = spec.from.as_deref().unwrap_or(name).trim();
    let leaves: Vec<usize> = (0..schema.num_columns())
        .filter(|&i| {
            schema
                .column(i)
                .path()
                .parts()
                .first()
                .is_some_and(|p| p == from)
        })
        .collect();
    let bad = |why: &str| {
        Err(format!(
            "field `{name}`: column `{from}` cannot be a `{}` field: {why}",
            spec.kind.name()
        ))
    };
    let binary = match leaves.as_slice() {
        [] => return Err(format!("field `{name}`: no column `{from}`")),
        [i] => {
            let c = schema.column(*i);
            (c.physical_type() == PhysicalType::BYTE_ARRAY
                && c.max_rep_level() == 0
                && c.path().parts().len() == 1)
                .then_some(*i)
        }
        _ => None,
    };
    if let Some(i) = binary {
        return Ok(Column::Binary(i));
    }
    let dtype = match leaves.as_slice() {
        [i] => number_dtype(&schema.column(*i)),
        _ => Err("not binary, nor a list of numbers".to_owned()),
    };
    let dtype = match (spec.kind, dtype) {
        (FieldKind::Json, dtype) => dtype.ok(),
        (FieldKind::Npy, Ok(dtype)) => Some(dtype),
        (FieldKind::Npy, Err(why)) => return bad(&why),
        _ => return bad("not a binary or string column"),
    };
    let depth = match leaves.as_slice() {
        [i] => usize::try_from(schema.column(*i).max_rep_level()).unwrap_or(0),
        _ => 0,
    };
    Ok(Column::Record {
        name: from.to_owned(),
        dtype,
        depth,
    })
}

/// The `.npy` dtype of a column of numbers, as Arrow (and so `datasets` and pyarrow) stores
/// them: the physical type and its logical (or older converted) type, so that a `uint8`
/// column is `|u1`, not the `INT32` it is stored as. Integers that are not numbers (dates,
/// times, timestamps, decimals) are refused, naming what they are.
fn number_dtype(c: &parquet::schema::types::ColumnDescriptor) -> Result<&'static str, String> {
    use parquet::basic::{ConvertedType as C, LogicalType as L};
    let not_numbers = |what: &str| Err(format!("it holds {what}, not numbers"));
    match c.logical_type_ref() {
        Some(L::Integer(t)) => {
            return match (t.bit_width, t.is_signed) {
                (8, true) => Ok("|i1"),
                (8, false) => Ok("|u1"),
                (16, true) => Ok("<i2"),
                (16, false) => Ok("<u2"),
                (32, true) => Ok("<i4"),
                (32, false) => Ok("<u4"),
                (64, true) => Ok("<i8"),
                (64, false) => Ok("<u8"),
                (bits, _) => Err(format!("an integer of {bits} bits")),
            };
        }
        Some(L::Float16) => return Ok("<f2"),
        Some(L::Date) => return not_numbers("dates"),
        Some(L::Time(_)) => return not_numbers("times of day"),
        Some(L::Timestamp(_)) => return not_numbers("timestamps"),
        Some(L::Decimal(_)) => return not_numbers("decimals"),
        Some(_) | None => {}
    }
    match c.converted_type() {
        C::INT_8 => return Ok("|i1"),
        C::UINT_8 => return Ok("|u1"),
        C::INT_16 => return Ok("<i2"),
        C::UINT_16 => return Ok("<u2"),
        C::UINT_32 => return Ok("<u4"),
        C::UINT_64 => return Ok("<u8"),
        C::DATE => return not_numbers("dates"),
        C::TIME_MILLIS | C::TIME_MICROS => return not_numbers("times of day"),
        C::TIMESTAMP_MILLIS | C::TIMESTAMP_MICROS => return not_numbers("timestamps"),
        C::DECIMAL => return not_numbers("decimals"),
        C::INTERVAL => return not_numbers("intervals"),
        _ => {}
    }
    match c.physical_type() {
        PhysicalType::FLOAT => Ok("<f4"),
        PhysicalType::DOUBLE => Ok("<f8"),
        PhysicalType::INT32 => Ok("<i4"),
        PhysicalType::INT64 => Ok("<i8"),
        PhysicalType::INT96 => not_numbers("timestamps (INT96)"),
        _ => Err("not binary, nor a list of numbers".to_owned()),
    }
}

/// The values of the small fields (`None`: null) of row `row` of group `group` of file
/// number `n`, record columns' through `reader`'s kept values.
pub(super) fn read(
    reader: &Reader,
    n: u32,
    file: &OpenFile,
    columns: &[Column],
    fields: &Fields,
    group: u32,
    row: u32,
) -> Result<FieldValues, String> {
    let meta = file.meta.row_group(group as usize);
    // The columns whose values for the group are not kept: an object's chunks of these,
    // each with one GET, all at once.
    let schema = meta.schema_descr();
    let key = |i: usize| (n, group, i as u32);
    let mut kept: Vec<_> = (0..columns.len())
        .map(|i| reader.kept_field_values(key(i)))
        .collect();
    let chunks: Vec<_> = columns
        .iter()
        .zip(&kept)
        .filter(|(_, k)| k.is_none())
        .flat_map(|(c, _)| match c {
            Column::Binary(leaf) => vec![*leaf],
            Column::Record { name, .. } => (0..schema.num_columns())
                .filter(|&i| schema.column(i).path().parts().first() == Some(name))
                .collect(),
        })
        .map(|leaf| chunk_range(meta, leaf))
        .collect();
    if !chunks.is_empty() {
        file.file.prefetch(&chunks)?;
    }
    columns
        .iter()
        .zip(fields.small())
        .enumerate()
        .map(|(i, (c, (name, spec)))| {
            let values = match kept[i].take() {
                Some(values) => Ok(values),
                None => reader.field_values(key(i), || match c {
                    Column::Binary(leaf) => read_cells(&file.file, meta, *leaf)
                        .map(|cells| {
                            Arc::new(
                                cells
                                    .into_iter()
                                    .map(|v| Ok(v.map(|b| b.data().to_vec())))
                                    .collect(),
                            )
                        })
                        .map_err(|e| e.to_string()),
                    Column::Record {
                        name: column,
                        dtype,
                        depth,
                    } => records(file, group, column, spec, *dtype, *depth),
                }),
            };
            values
                .and_then(|r| match r.get(row as usize) {
                    Some(v) => v.clone(),
                    None => Err("the row is missing (the file changed since indexing?)".into()),
                })
                .map_err(|e| format!("field `{name}`: {e}"))
        })
        .collect()
}

/// The values of top-level column `column` in every row of group `group`, assembled and
/// converted to the bytes of field `spec` (a row's failure is its own, not the group's).
fn records(
    file: &OpenFile,
    group: u32,
    column: &str,
    spec: &FieldSpec,
    dtype: Option<&str>,
    depth: usize,
) -> Result<FieldValuesOfGroup, String> {
    let meta = file.meta.row_group(group as usize);
    let schema = file.meta.file_metadata().schema_descr();
    let Some(field) = schema
        .root_schema()
        .get_fields()
        .iter()
        .find(|f| f.name() == column)
    else {
        return Err(format!(
            "no column `{column}` (the file changed since indexing?)"
        ));
    };
    let projection = Type::group_type_builder(schema.root_schema().name())
        .with_fields(vec![field.clone()])
        .build()
        .map_err(|e| e.to_string())?;
    let reader = SerializedRowGroupReader::new(
        file.file.clone(),
        meta,
        RowGroupPageIndex::new(group as usize, None),
        Arc::new(ReaderProperties::builder().build()),
    )
    .map_err(|e| e.to_string())?;
    let rows = RowIter::from_row_group(Some(projection), &reader).map_err(|e| e.to_string())?;
    let values = rows
        .map(|row: Result<Row, _>| {
            let row = row.map_err(|e| e.to_string())?;
            match row.get_column_iter().next().map(|(_, f)| f) {
                None | Some(Field::Null) => Ok(None),
                Some(f) => convert(f, spec, dtype, depth).map(Some),
            }
        })
        .collect();
    Ok(Arc::new(values))
}

/// An assembled value as a field's bytes: JSON text, or an `.npy` of numbers.
fn convert(
    f: &Field,
    spec: &FieldSpec,
    dtype: Option<&str>,
    depth: usize,
) -> Result<Vec<u8>, String> {
    match (spec.kind, dtype) {
        (FieldKind::Npy, Some(dtype)) => {
            let mut shape = Vec::new();
            let mut values = Vec::new();
            flatten(f, 0, &mut shape, &mut values)?;
            if values.is_empty() {
                // Below an empty list the lengths are unknown: 0, with the column's dimensions.
                shape.resize(depth.max(shape.len()), 0);
            }
            Ok(npy(dtype, &shape, &values))
        }
        _ => serde_json::to_vec(&f.to_json_value()).map_err(|e| e.to_string()),
    }
}

/// A number of an array.
#[derive(Clone, Copy)]
enum Number {
    F(f64),
    I(i64),
    U(u64),
}

/// Appends the numbers of a (nested) list to `values`, checking that lists at one depth all
/// have one length (`shape[depth]`).
fn flatten(
    f: &Field,
    depth: usize,
    shape: &mut Vec<u64>,
    values: &mut Vec<Number>,
) -> Result<(), String> {
    let n = match f {
        Field::Float16(v) => Number::F(f64::from(v.to_f32())),
        Field::Float(v) => Number::F(f64::from(*v)),
        Field::Double(v) => Number::F(*v),
        Field::Byte(v) => Number::I(i64::from(*v)),
        Field::Short(v) => Number::I(i64::from(*v)),
        Field::Int(v) => Number::I(i64::from(*v)),
        Field::Long(v) => Number::I(*v),
        Field::UByte(v) => Number::U(u64::from(*v)),
        Field::UShort(v) => Number::U(u64::from(*v)),
        Field::UInt(v) => Number::U(u64::from(*v)),
        Field::ULong(v) => Number::U(*v),
        Field::ListInternal(list) => {
            let items = list.elements();
            match shape.get(depth) {
                Some(&len) if len != items.len() as u64 => {
                    return Err(format!(
                        "a ragged list: lengths {len} and {} at depth {depth}",
                        items.len()
                    ));
                }
                Some(_) => {}
                None if shape.len() == depth => shape.push(items.len() as u64),
                None => return Err("lists nested to unequal depths".into()),
            }
            for item in items {
                flatten(item, depth + 1, shape, values)?;
            }
            return Ok(());
        }
        Field::Null => return Err("a null inside its list".into()),
        other => return Err(format!("{other} is not a number")),
    };
    if shape.len() > depth {
        return Err("lists nested to unequal depths".into());
    }
    values.push(n);
    Ok(())
}

/// An `.npy` file (format 1.0) of `values` with `shape` and `dtype` (one of
/// [`number_dtype`]'s: the column's own type, so each value is written as it was stored).
fn npy(dtype: &str, shape: &[u64], values: &[Number]) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(u64::to_string).collect();
    let shape = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    let header = format!("{{'descr': '{dtype}', 'fortran_order': False, 'shape': {shape}, }}");
    let mut out = super::super::fields::npy_start(&header);
    for v in values {
        // A column's values are all of its type: the casts below are exact.
        let (f, i, u) = match *v {
            Number::F(f) => (f, f as i64, f as u64),
            Number::I(i) => (i as f64, i, i as u64),
            Number::U(u) => (u as f64, u as i64, u),
        };
        match dtype {
            "<f2" => out.extend_from_slice(&half::f16::from_f64(f).to_le_bytes()),
            "<f4" => out.extend_from_slice(&(f as f32).to_le_bytes()),
            "<f8" => out.extend_from_slice(&f.to_le_bytes()),
            "|i1" => out.extend_from_slice(&(i as i8).to_le_bytes()),
            "<i2" => out.extend_from_slice(&(i as i16).to_le_bytes()),
            "<i4" => out.extend_from_slice(&(i as i32).to_le_bytes()),
            "|u1" => out.extend_from_slice(&(u as u8).to_le_bytes()),
            "<u2" => out.extend_from_slice(&(u as u16).to_le_bytes()),
            "<u4" => out.extend_from_slice(&(u as u32).to_le_bytes()),
            "<u8" => out.extend_from_slice(&u.to_le_bytes()),
            _ => out.extend_from_slice(&i.to_le_bytes()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::super::fields::npy_shape;
    use super::*;

    #[test]
    fn nested_lists_become_arrays() {
        let values = [Number::F(1.5), Number::F(2.0), Number::I(3), Number::I(4)];
        let b = npy("<f4", &[2, 2], &values);
        assert_eq!(npy_shape(&b).unwrap(), [2, 2]);
        assert_eq!(&b[b.len() - 4..], &4.0f32.to_le_bytes());
        assert_eq!(npy_shape(&npy("<i8", &[3], &values[..3])).unwrap(), [3]);
        assert_eq!(npy_shape(&npy("<f8", &[0], &[])).unwrap(), [0]);
    }

    /// Each dtype writes its values at its own width, unsigned 64-bit ones above i64::MAX
    /// included.
    #[test]
    fn every_number_type_keeps_its_width() {
        let data = |dtype: &str, values: &[Number]| {
            let b = npy(dtype, &[values.len() as u64], values);
            b[b.len() - values.len() * dtype[2..].parse::<usize>().unwrap()..].to_vec()
        };
        assert_eq!(data("|u1", &[Number::U(0), Number::U(255)]), [0, 255]);
        assert_eq!(
            data("|i1", &[Number::I(-128), Number::I(127)]),
            [0x80, 0x7f]
        );
        assert_eq!(data("<u2", &[Number::U(65535)]), 65535u16.to_le_bytes());
        assert_eq!(data("<i2", &[Number::I(-2)]), (-2i16).to_le_bytes());
        assert_eq!(
            data("<u4", &[Number::U(u64::from(u32::MAX))]),
            u32::MAX.to_le_bytes()
        );
        assert_eq!(data("<u8", &[Number::U(u64::MAX)]), u64::MAX.to_le_bytes());
        assert_eq!(data("<i8", &[Number::I(i64::MIN)]), i64::MIN.to_le_bytes());
        assert_eq!(
            data("<f2", &[Number::F(1.5)]),
            half::f16::from_f32(1.5).to_le_bytes()
        );
    }
}
