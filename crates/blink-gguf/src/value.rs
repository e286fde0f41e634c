//! Metadata values: the scalar [`Value`], the homogeneous [`Array`], their accessors,
//! conversions and a short one-line `Display`.

use std::fmt;

/// The GGUF value type tags, as stored in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl ValueType {
    pub(crate) fn from_id(id: u32) -> Option<Self> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// The fewest bytes one value of this type can occupy in a file.
    pub(crate) fn min_size(self) -> u64 {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 => 8,
            // Length prefix only.
            String => 8,
            // Element type plus count.
            Array => 12,
        }
    }
}

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Array),
}

/// A metadata array. GGUF arrays are homogeneous; arrays of arrays may differ per element.
#[derive(Clone, Debug, PartialEq)]
pub enum Array {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F32(Vec<f32>),
    F64(Vec<f64>),
    Bool(Vec<bool>),
    String(Vec<String>),
    Array(Vec<Array>),
}

impl Value {
    /// The GGUF name of this value's type (`"u32"`, `"string"`, `"array[f32]"`, ...).
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::U8(_) => "u8",
            Value::I8(_) => "i8",
            Value::U16(_) => "u16",
            Value::I16(_) => "i16",
            Value::U32(_) => "u32",
            Value::I32(_) => "i32",
            Value::U64(_) => "u64",
            Value::I64(_) => "i64",
            Value::F32(_) => "f32",
            Value::F64(_) => "f64",
            Value::Bool(_) => "bool",
            Value::String(_) => "string",
            Value::Array(a) => a.type_name(),
        }
    }

    pub(crate) fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F32(_) => ValueType::F32,
            Value::F64(_) => ValueType::F64,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
        }
    }

    /// Any integer value as `i128`, which holds every GGUF integer exactly.
    fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// Any integer value that is non-negative.
    pub fn as_u64(&self) -> Option<u64> {
        self.as_i128().and_then(|v| u64::try_from(v).ok())
    }

    /// Any integer value that fits in `i64`.
    pub fn as_i64(&self) -> Option<i64> {
        self.as_i128().and_then(|v| i64::try_from(v).ok())
    }

    /// An `f32` or `f64` value.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&Array> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

macro_rules! array_accessors {
    ($($(#[$doc:meta])* $name:ident => $variant:ident: $ty:ty;)*) => {
        impl Array {
            $(
                $(#[$doc])*
                pub fn $name(&self) -> Option<&[$ty]> {
                    match self {
                        Array::$variant(v) => Some(v),
                        _ => None,
                    }
                }
            )*
        }
    };
}

array_accessors! {
    as_u8 => U8: u8;
    as_i8 => I8: i8;
    as_u16 => U16: u16;
    as_i16 => I16: i16;
    as_u32 => U32: u32;
    as_i32 => I32: i32;
    as_u64 => U64: u64;
    as_i64 => I64: i64;
    as_f32 => F32: f32;
    as_f64 => F64: f64;
    as_bool => Bool: bool;
    /// The elements of a string array (token texts, merges, ...).
    as_strings => String: String;
    /// The elements of an array of arrays.
    as_arrays => Array: Array;
}

impl Array {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::F64(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::Array(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The elements of an integer array as `u64`; `None` for other arrays, or when an
    /// element is negative.
    pub fn to_u64s(&self) -> Option<Vec<u64>> {
        fn widen<T: Copy + TryInto<u64>>(v: &[T]) -> Option<Vec<u64>> {
            v.iter().map(|&x| x.try_into().ok()).collect()
        }
        match self {
            Array::U8(v) => widen(v),
            Array::I8(v) => widen(v),
            Array::U16(v) => widen(v),
            Array::I16(v) => widen(v),
            Array::U32(v) => widen(v),
            Array::I32(v) => widen(v),
            Array::U64(v) => Some(v.clone()),
            Array::I64(v) => widen(v),
            _ => None,
        }
    }

    /// The type name of the array, element type included: `"array[string]"`, `"array[f32]"`.
    pub fn type_name(&self) -> &'static str {
        match self {
            Array::U8(_) => "array[u8]",
            Array::I8(_) => "array[i8]",
            Array::U16(_) => "array[u16]",
            Array::I16(_) => "array[i16]",
            Array::U32(_) => "array[u32]",
            Array::I32(_) => "array[i32]",
            Array::U64(_) => "array[u64]",
            Array::I64(_) => "array[i64]",
            Array::F32(_) => "array[f32]",
            Array::F64(_) => "array[f64]",
            Array::Bool(_) => "array[bool]",
            Array::String(_) => "array[string]",
            Array::Array(_) => "array[array]",
        }
    }

    pub(crate) fn element_type(&self) -> ValueType {
        match self {
            Array::U8(_) => ValueType::U8,
            Array::I8(_) => ValueType::I8,
            Array::U16(_) => ValueType::U16,
            Array::I16(_) => ValueType::I16,
            Array::U32(_) => ValueType::U32,
            Array::I32(_) => ValueType::I32,
            Array::U64(_) => ValueType::U64,
            Array::I64(_) => ValueType::I64,
            Array::F32(_) => ValueType::F32,
            Array::F64(_) => ValueType::F64,
            Array::Bool(_) => ValueType::Bool,
            Array::String(_) => ValueType::String,
            Array::Array(_) => ValueType::Array,
        }
    }
}

macro_rules! value_from {
    ($($ty:ty => $variant:ident),* $(,)?) => {
        $(
            impl From<$ty> for Value {
                fn from(v: $ty) -> Self {
                    Value::$variant(v)
                }
            }
            impl From<Vec<$ty>> for Array {
                fn from(v: Vec<$ty>) -> Self {
                    Array::$variant(v)
                }
            }
            impl From<Vec<$ty>> for Value {
                fn from(v: Vec<$ty>) -> Self {
                    Value::Array(Array::$variant(v))
                }
            }
        )*
    };
}

value_from! {
    u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32,
    u64 => U64, i64 => I64, f32 => F32, f64 => F64, bool => Bool, String => String,
}

impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Value::String(v.to_owned())
    }
}

impl From<Array> for Value {
    fn from(v: Array) -> Self {
        Value::Array(v)
    }
}

/// Strings longer than this many characters are shortened in `Display`.
const SHOWN_CHARS: usize = 60;
/// Arrays longer than this are summarised by length in `Display`.
const SHOWN_ELEMENTS: usize = 8;

fn write_string(f: &mut fmt::Formatter<'_>, s: &str) -> fmt::Result {
    f.write_str("\"")?;
    for c in s.chars().take(SHOWN_CHARS) {
        if c == '\'' {
            f.write_str("'")?;
        } else {
            write!(f, "{}", c.escape_debug())?;
        }
    }
    f.write_str("\"")?;
    let total = s.chars().count();
    if total > SHOWN_CHARS {
        write!(f, "… ({} bytes)", s.len())?;
    }
    Ok(())
}

fn write_list<T>(
    f: &mut fmt::Formatter<'_>,
    items: &[T],
    mut each: impl FnMut(&mut fmt::Formatter<'_>, &T) -> fmt::Result,
) -> fmt::Result {
    f.write_str("[")?;
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            f.write_str(", ")?;
        }
        each(f, item)?;
    }
    f.write_str("]")
}

impl fmt::Display for Array {
    /// Short arrays are listed; longer ones are summarised as `[49152 strings]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.len();
        if n > SHOWN_ELEMENTS {
            return match self {
                Array::String(_) => write!(f, "[{n} strings]"),
                Array::Array(_) => write!(f, "[{n} arrays]"),
                _ => {
                    let elem = self
                        .type_name()
                        .trim_start_matches("array[")
                        .trim_end_matches(']');
                    write!(f, "[{n} × {elem}]")
                }
            };
        }
        fn plain<T: fmt::Display>(f: &mut fmt::Formatter<'_>, v: &T) -> fmt::Result {
            write!(f, "{v}")
        }
        match self {
            Array::U8(v) => write_list(f, v, plain),
            Array::I8(v) => write_list(f, v, plain),
            Array::U16(v) => write_list(f, v, plain),
            Array::I16(v) => write_list(f, v, plain),
            Array::U32(v) => write_list(f, v, plain),
            Array::I32(v) => write_list(f, v, plain),
            Array::U64(v) => write_list(f, v, plain),
            Array::I64(v) => write_list(f, v, plain),
            Array::F32(v) => write_list(f, v, plain),
            Array::F64(v) => write_list(f, v, plain),
            Array::Bool(v) => write_list(f, v, plain),
            Array::String(v) => write_list(f, v, |f, s| write_string(f, s)),
            Array::Array(v) => write_list(f, v, plain),
        }
    }
}

impl fmt::Display for Value {
    /// One line: numbers as numbers, strings quoted (long ones shortened), arrays per `Array`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::U8(v) => write!(f, "{v}"),
            Value::I8(v) => write!(f, "{v}"),
            Value::U16(v) => write!(f, "{v}"),
            Value::I16(v) => write!(f, "{v}"),
            Value::U32(v) => write!(f, "{v}"),
            Value::I32(v) => write!(f, "{v}"),
            Value::U64(v) => write!(f, "{v}"),
            Value::I64(v) => write!(f, "{v}"),
            Value::F32(v) => write!(f, "{v}"),
            Value::F64(v) => write!(f, "{v}"),
            Value::Bool(v) => write!(f, "{v}"),
            Value::String(s) => write_string(f, s),
            Value::Array(a) => write!(f, "{a}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_views() {
        assert_eq!(Value::I32(-1).as_u64(), None);
        assert_eq!(Value::I32(7).as_u64(), Some(7));
        assert_eq!(Value::U64(u64::MAX).as_i64(), None);
        assert_eq!(Value::U64(u64::MAX).as_u64(), Some(u64::MAX));
        assert_eq!(Value::F32(1.0).as_u64(), None);
        assert_eq!(Value::F32(0.5).as_f64(), Some(0.5));
    }

    #[test]
    fn display_is_short_and_single_line() {
        assert_eq!(Value::from("a\nb").to_string(), "\"a\\nb\"");
        let long = Value::from("x".repeat(100));
        assert_eq!(
            long.to_string(),
            format!("\"{}\"… (100 bytes)", "x".repeat(60))
        );
        let toks: Value = vec!["a".to_string(); 49152].into();
        assert_eq!(toks.to_string(), "[49152 strings]");
        assert_eq!(Value::from(vec![1i32, -2]).to_string(), "[1, -2]");
        assert_eq!(Value::from(vec![0f32; 10]).to_string(), "[10 × f32]");
        let nested = Value::Array(Array::Array(vec![
            Array::U8(vec![1]),
            Array::Bool(vec![true]),
        ]));
        assert_eq!(nested.to_string(), "[[1], [true]]");
    }

    #[test]
    fn array_accessors_and_names() {
        let a = Array::from(vec!["x".to_string()]);
        assert_eq!(a.as_strings().map(<[String]>::len), Some(1));
        assert_eq!(a.as_f32(), None);
        assert_eq!(a.type_name(), "array[string]");
    }
}
