//! Tensor element types named the way torch names them on the wire.

use std::fmt;

macro_rules! dtypes {
    ($( $variant:ident = $name:literal, $size:literal $(, $alias:literal)* ; )*) => {
        /// A torch dtype that can travel through the EC channel.
        ///
        /// Aliases (`half`, `float`, `long`, ...) are accepted on input; replies and events
        /// always carry the canonical name, which a Python peer resolves to the same dtype.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum DType { $( $variant, )* }

        impl DType {
            /// Every supported dtype.
            pub const ALL: &'static [DType] = &[ $( DType::$variant, )* ];

            /// Canonical bare name, as `str(torch.float16).removeprefix("torch.")`.
            pub fn name(self) -> &'static str {
                match self { $( DType::$variant => $name, )* }
            }

            /// Bytes per element (`torch.empty((), dtype=d).element_size()`).
            pub fn itemsize(self) -> u64 {
                match self { $( DType::$variant => $size, )* }
            }

            /// Looks up a bare torch dtype name or alias.
            pub fn from_name(name: &str) -> Option<DType> {
                match name {
                    $( $name $(| $alias)* => Some(DType::$variant), )*
                    _ => None,
                }
            }
        }
    };
}

dtypes! {
    Float16 = "float16", 2, "half";
    BFloat16 = "bfloat16", 2;
    Float32 = "float32", 4, "float";
    Float64 = "float64", 8, "double";
    Float8E4M3Fn = "float8_e4m3fn", 1;
    Float8E4M3Fnuz = "float8_e4m3fnuz", 1;
    Float8E5M2 = "float8_e5m2", 1;
    Float8E5M2Fnuz = "float8_e5m2fnuz", 1;
    Int8 = "int8", 1;
    UInt8 = "uint8", 1;
    Int16 = "int16", 2, "short";
    UInt16 = "uint16", 2;
    Int32 = "int32", 4, "int";
    UInt32 = "uint32", 4;
    Int64 = "int64", 8, "long";
    UInt64 = "uint64", 8;
    Bool = "bool", 1;
    Complex32 = "complex32", 4, "chalf";
    Complex64 = "complex64", 8, "cfloat";
    Complex128 = "complex128", 16, "cdouble";
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_aliases_resolve() {
        for d in DType::ALL {
            assert_eq!(DType::from_name(d.name()), Some(*d));
        }
        assert_eq!(DType::from_name("half"), Some(DType::Float16));
        assert_eq!(DType::from_name("torch.float16"), None);
        assert_eq!(DType::Float16.itemsize(), 2);
        assert_eq!(DType::BFloat16.itemsize(), 2);
    }
}
