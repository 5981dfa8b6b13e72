//! [`GrpcCode`]: gRPC's status codes as numbers on the wire, without depending on a gRPC
//! library (the HTTP-only side of the contract needs them too, to say what a reason means
//! over gRPC).

/// A gRPC status code (`grpc-status`), as the gRPC specification numbers them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum GrpcCode {
    /// `OK`.
    Ok = 0,
    /// `CANCELLED`.
    Cancelled = 1,
    /// `UNKNOWN`.
    Unknown = 2,
    /// `INVALID_ARGUMENT`.
    InvalidArgument = 3,
    /// `DEADLINE_EXCEEDED`.
    DeadlineExceeded = 4,
    /// `NOT_FOUND`.
    NotFound = 5,
    /// `ALREADY_EXISTS`.
    AlreadyExists = 6,
    /// `PERMISSION_DENIED`.
    PermissionDenied = 7,
    /// `RESOURCE_EXHAUSTED`.
    ResourceExhausted = 8,
    /// `FAILED_PRECONDITION`.
    FailedPrecondition = 9,
    /// `ABORTED`.
    Aborted = 10,
    /// `OUT_OF_RANGE`.
    OutOfRange = 11,
    /// `UNIMPLEMENTED`.
    Unimplemented = 12,
    /// `INTERNAL`.
    Internal = 13,
    /// `UNAVAILABLE`.
    Unavailable = 14,
    /// `DATA_LOSS`.
    DataLoss = 15,
    /// `UNAUTHENTICATED`.
    Unauthenticated = 16,
}

impl GrpcCode {
    /// Every code, by number.
    pub const ALL: [Self; 17] = [
        Self::Ok,
        Self::Cancelled,
        Self::Unknown,
        Self::InvalidArgument,
        Self::DeadlineExceeded,
        Self::NotFound,
        Self::AlreadyExists,
        Self::PermissionDenied,
        Self::ResourceExhausted,
        Self::FailedPrecondition,
        Self::Aborted,
        Self::OutOfRange,
        Self::Unimplemented,
        Self::Internal,
        Self::Unavailable,
        Self::DataLoss,
        Self::Unauthenticated,
    ];

    /// The code numbered `n`; a number outside the specification is `UNKNOWN`, as gRPC
    /// libraries read it.
    pub fn from_number(n: u32) -> Self {
        usize::try_from(n)
            .ok()
            .and_then(|i| Self::ALL.get(i).copied())
            .unwrap_or(Self::Unknown)
    }

    /// Its number.
    pub const fn number(self) -> u32 {
        self as u32
    }

    /// The code an answer's `grpc-status` names, from the head (a trailers-only answer) or
    /// the trailers; `None` when neither has one.
    pub fn of_answer(head: &http::HeaderMap, trailers: Option<&http::HeaderMap>) -> Option<Self> {
        let field = crate::header::GRPC_STATUS;
        head.get(&field)
            .or_else(|| trailers.and_then(|t| t.get(&field)))
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse().ok())
            .map(Self::from_number)
    }
}

#[cfg(feature = "grpc")]
impl From<GrpcCode> for tonic::Code {
    fn from(code: GrpcCode) -> Self {
        Self::from_i32(code as i32)
    }
}

#[cfg(feature = "grpc")]
impl From<tonic::Code> for GrpcCode {
    fn from(code: tonic::Code) -> Self {
        u32::try_from(code as i32).map_or(Self::Unknown, Self::from_number)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_round_trip() {
        for (i, c) in GrpcCode::ALL.into_iter().enumerate() {
            assert_eq!(c.number() as usize, i);
            assert_eq!(GrpcCode::from_number(c.number()), c);
        }
        assert_eq!(GrpcCode::from_number(17), GrpcCode::Unknown);
        assert_eq!(GrpcCode::from_number(u32::MAX), GrpcCode::Unknown);
        let mut t = http::HeaderMap::new();
        t.insert("grpc-status", http::HeaderValue::from_static(" 14"));
        assert_eq!(
            GrpcCode::of_answer(&http::HeaderMap::new(), Some(&t)),
            Some(GrpcCode::Unavailable)
        );
        assert_eq!(GrpcCode::of_answer(&http::HeaderMap::new(), None), None);
    }
}
