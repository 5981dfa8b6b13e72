//! The small values every part of the model passes around.

/// A gateway's index; it is also the owner id of every claim the gateway makes (the fence
/// tells one claim of a gateway from the next).
pub type GatewayId = u8;

/// A client's index.
pub type ClientId = u8;

/// A claim's fence: the store hands them out strictly increasing, starting at 1.
pub type Fence = u8;

/// The response an execution produced. Its id is the fence of the request that executed, so
/// two executions never produce the same response and a wrong answer is visible.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Response(pub Fence);

/// A set of fences (1..=7), as a bitmask: small to hash and copy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FenceSet(u8);

impl FenceSet {
    /// Whether `fence` is in the set.
    pub const fn contains(self, fence: Fence) -> bool {
        self.0 & Self::bit(fence) != 0
    }

    /// Adds `fence`.
    pub const fn insert(&mut self, fence: Fence) {
        self.0 |= Self::bit(fence);
    }

    /// Removes `fence`; whether it was there.
    pub const fn remove(&mut self, fence: Fence) -> bool {
        let was = self.contains(fence);
        self.0 &= !Self::bit(fence);
        was
    }

    /// The fences in the set, lowest first.
    pub fn iter(self) -> impl Iterator<Item = Fence> {
        (1..=7).filter(move |f| self.contains(*f))
    }

    const fn bit(fence: Fence) -> u8 {
        assert!(fence >= 1 && fence <= 7, "fences in the model are 1..=7");
        1 << fence
    }
}
