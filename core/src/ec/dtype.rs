//! Tensor element types named the way torch names them on the wire.

use std::fmt;

macro_rules! dtypes {
    ($( $variant:ident = $name:literal, $size:literal, $canonical:ident ; )*) => {
        /// A torch dtype name that can travel through the EC channel: every bare
        /// attribute name of `torch` that is a `torch.dtype` (torch 2.14's table),
        /// aliases (`half`, `int`, `cdouble`, ...) included.
        ///
        /// A value is the name as the request spelled it, because the consumer keeps and
        /// compares names as names: `int` and `int32` are the same element type but two
        /// different names, so a reservation made as `int32` conflicts with one asking
        /// for `int`, and status and events echo the spelling the reservation was made
        /// with. [`DType::canonical`] gives the element type itself, for comparisons that
        /// are about the tensor (a resident copy's dtype).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum DType { $( $variant, )* }

        impl DType {
            /// Every name, aliases included.
            pub const ALL: &'static [DType] = &[ $( DType::$variant, )* ];

            /// The bare name as spelled (`torch.<name>`).
            pub fn name(self) -> &'static str {
                match self { $( DType::$variant => $name, )* }
            }

            /// Bytes per element (`torch.<name>.itemsize`).
            pub fn itemsize(self) -> u64 {
                match self { $( DType::$variant => $size, )* }
            }

            /// The element type an alias names (`int` -> `int32`); a canonical name is its
            /// own. `str(torch.<name>)` is `torch.<canonical>`.
            pub fn canonical(self) -> DType {
                match self { $( DType::$variant => DType::$canonical, )* }
            }

            /// Looks up a bare torch dtype name or alias, as `getattr(torch, name)` being a
            /// `torch.dtype`.
            pub fn from_name(name: &str) -> Option<DType> {
                match name {
                    $( $name => Some(DType::$variant), )*
                    _ => None,
                }
            }
        }
    };
}

dtypes! {
    Float16 = "float16", 2, Float16;
    Half = "half", 2, Float16;
    BFloat16 = "bfloat16", 2, BFloat16;
    Float32 = "float32", 4, Float32;
    Float = "float", 4, Float32;
    Float64 = "float64", 8, Float64;
    Double = "double", 8, Float64;
    Float8E4M3Fn = "float8_e4m3fn", 1, Float8E4M3Fn;
    Float8E4M3Fnuz = "float8_e4m3fnuz", 1, Float8E4M3Fnuz;
    Float8E5M2 = "float8_e5m2", 1, Float8E5M2;
    Float8E5M2Fnuz = "float8_e5m2fnuz", 1, Float8E5M2Fnuz;
    Float8E8M0Fnu = "float8_e8m0fnu", 1, Float8E8M0Fnu;
    Float4E2M1FnX2 = "float4_e2m1fn_x2", 1, Float4E2M1FnX2;
    Int8 = "int8", 1, Int8;
    UInt8 = "uint8", 1, UInt8;
    Int16 = "int16", 2, Int16;
    Short = "short", 2, Int16;
    UInt16 = "uint16", 2, UInt16;
    Int32 = "int32", 4, Int32;
    Int = "int", 4, Int32;
    UInt32 = "uint32", 4, UInt32;
    Int64 = "int64", 8, Int64;
    Long = "long", 8, Int64;
    UInt64 = "uint64", 8, UInt64;
    Bool = "bool", 1, Bool;
    Complex32 = "complex32", 4, Complex32;
    CHalf = "chalf", 4, Complex32;
    Complex64 = "complex64", 8, Complex64;
    CFloat = "cfloat", 8, Complex64;
    Complex128 = "complex128", 16, Complex128;
    CDouble = "cdouble", 16, Complex128;
    QUInt8 = "quint8", 1, QUInt8;
    QInt8 = "qint8", 1, QInt8;
    QInt32 = "qint32", 4, QInt32;
    QUInt4x2 = "quint4x2", 1, QUInt4x2;
    QUInt2x4 = "quint2x4", 1, QUInt2x4;
    Bits1x8 = "bits1x8", 1, Bits1x8;
    Bits2x4 = "bits2x4", 1, Bits2x4;
    Bits4x2 = "bits4x2", 1, Bits4x2;
    Bits8 = "bits8", 1, Bits8;
    Bits16 = "bits16", 2, Bits16;
    UInt1 = "uint1", 1, UInt1;
    UInt2 = "uint2", 1, UInt2;
    UInt3 = "uint3", 1, UInt3;
    UInt4 = "uint4", 1, UInt4;
    UInt5 = "uint5", 1, UInt5;
    UInt6 = "uint6", 1, UInt6;
    UInt7 = "uint7", 1, UInt7;
    Int1 = "int1", 1, Int1;
    Int2 = "int2", 1, Int2;
    Int3 = "int3", 1, Int3;
    Int4 = "int4", 1, Int4;
    Int5 = "int5", 1, Int5;
    Int6 = "int6", 1, Int6;
    Int7 = "int7", 1, Int7;
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
    fn names_round_trip_and_aliases_keep_their_spelling() {
        for d in DType::ALL {
            assert_eq!(DType::from_name(d.name()), Some(*d));
            assert_eq!(d.canonical().canonical(), d.canonical());
            assert_eq!(d.itemsize(), d.canonical().itemsize());
        }
        assert_eq!(DType::from_name("half"), Some(DType::Half));
        assert_ne!(DType::Half, DType::Float16, "names are compared as names");
        assert_eq!(DType::Half.canonical(), DType::Float16);
        assert_eq!(DType::from_name("cdouble").map(DType::canonical), Some(DType::Complex128));
        assert_eq!(DType::from_name("float8_e8m0fnu").map(DType::itemsize), Some(1));
        assert_eq!(DType::from_name("float4_e2m1fn_x2").map(DType::itemsize), Some(1));
        assert_eq!(DType::from_name("torch.float16"), None);
        assert_eq!(DType::from_name("nan"), None);
        assert_eq!(DType::Float16.itemsize(), 2);
        assert_eq!(DType::BFloat16.itemsize(), 2);
    }
}
