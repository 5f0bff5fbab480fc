//! NRI events and the event mask a plugin subscribes with (`ConfigureResponse.events`).
//!
//! Event numbers follow the protocol's `Event` enum; the mask bit of event `n` is `1 << (n - 1)`.

use std::fmt;
use std::str::FromStr;

/// One NRI event (protocol number in the discriminant).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Event {
    /// A pod sandbox was created and started.
    RunPodSandbox = 1,
    /// A pod sandbox is being stopped.
    StopPodSandbox = 2,
    /// A pod sandbox was removed.
    RemovePodSandbox = 3,
    /// A container is being created (the plugin may adjust it).
    CreateContainer = 4,
    /// A container was created.
    PostCreateContainer = 5,
    /// A container is being started.
    StartContainer = 6,
    /// A container was started.
    PostStartContainer = 7,
    /// A container's resources are being updated (the plugin may change the update).
    UpdateContainer = 8,
    /// A container's resources were updated.
    PostUpdateContainer = 9,
    /// A container is being stopped.
    StopContainer = 10,
    /// A container was removed.
    RemoveContainer = 11,
    /// A pod sandbox's resources are being updated (NRI v0.10).
    UpdatePodSandbox = 12,
    /// A pod sandbox's resources were updated (NRI v0.10).
    PostUpdatePodSandbox = 13,
    /// Validation of the merged adjustments (validator plugins, NRI v0.10).
    ValidateContainerAdjustment = 14,
}

impl Event {
    /// Every event, in protocol order.
    pub const ALL: [Event; 14] = [
        Event::RunPodSandbox,
        Event::StopPodSandbox,
        Event::RemovePodSandbox,
        Event::CreateContainer,
        Event::PostCreateContainer,
        Event::StartContainer,
        Event::PostStartContainer,
        Event::UpdateContainer,
        Event::PostUpdateContainer,
        Event::StopContainer,
        Event::RemoveContainer,
        Event::UpdatePodSandbox,
        Event::PostUpdatePodSandbox,
        Event::ValidateContainerAdjustment,
    ];

    /// The protocol number.
    pub const fn number(self) -> i32 {
        self as i32
    }

    /// The event with protocol number `n` (`None` for UNKNOWN, LAST and unknown numbers).
    pub fn from_number(n: i32) -> Option<Event> {
        Event::ALL.into_iter().find(|e| e.number() == n)
    }

    /// The mask bit, `1 << (number - 1)`.
    pub const fn bit(self) -> u32 {
        1 << (self as u32 - 1)
    }

    /// The name as the Go stub prints and parses it, e.g. `RunPodSandbox`.
    pub const fn name(self) -> &'static str {
        match self {
            Event::RunPodSandbox => "RunPodSandbox",
            Event::StopPodSandbox => "StopPodSandbox",
            Event::RemovePodSandbox => "RemovePodSandbox",
            Event::CreateContainer => "CreateContainer",
            Event::PostCreateContainer => "PostCreateContainer",
            Event::StartContainer => "StartContainer",
            Event::PostStartContainer => "PostStartContainer",
            Event::UpdateContainer => "UpdateContainer",
            Event::PostUpdateContainer => "PostUpdateContainer",
            Event::StopContainer => "StopContainer",
            Event::RemoveContainer => "RemoveContainer",
            Event::UpdatePodSandbox => "UpdatePodSandbox",
            Event::PostUpdatePodSandbox => "PostUpdatePodSandbox",
            Event::ValidateContainerAdjustment => "ValidateContainerAdjustment",
        }
    }
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An event name that is not known.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown NRI event {0:?}")]
pub struct UnknownEvent(pub String);

impl FromStr for Event {
    type Err = UnknownEvent;

    /// Case-insensitive, as the Go stub.
    fn from_str(s: &str) -> Result<Event, UnknownEvent> {
        let want = s.trim();
        Event::ALL.into_iter().find(|e| e.name().eq_ignore_ascii_case(want)).ok_or_else(|| UnknownEvent(s.to_string()))
    }
}

/// A set of events (`ConfigureResponse.events`, an int32 on the wire).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct EventMask(u32);

impl EventMask {
    /// No event.
    pub const EMPTY: EventMask = EventMask(0);
    /// Every event of NRI v0.10 and later (`ValidEvents` there: bits 1..=14, 0x3FFF).
    pub const ALL: EventMask = EventMask((1 << 14) - 1);
    /// Every event of NRI up to v0.9 (`ValidEvents` there: bits 1..=11, 0x7FF); such runtimes
    /// drop a plugin whose subscription has any other bit.
    pub const UP_TO_V0_9: EventMask = EventMask((1 << 11) - 1);

    /// The mask with these raw bits (unknown bits are kept).
    pub const fn from_bits(bits: u32) -> EventMask {
        EventMask(bits)
    }

    /// The raw bits.
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// The value sent in `ConfigureResponse.events`.
    pub const fn to_wire(self) -> i32 {
        self.0 as i32
    }

    /// The mask a runtime reads from `ConfigureResponse.events`; 0 means every event (so a
    /// plugin must never send 0 unless it handles everything, validation included).
    pub const fn from_wire(events: i32) -> EventMask {
        if events == 0 { EventMask::ALL } else { EventMask(events as u32) }
    }

    /// The events in both masks.
    pub const fn intersection(self, other: EventMask) -> EventMask {
        EventMask(self.0 & other.0)
    }

    /// The events of `self` not in `other`.
    pub const fn difference(self, other: EventMask) -> EventMask {
        EventMask(self.0 & !other.0)
    }

    /// Whether `event` is in the mask.
    pub const fn contains(self, event: Event) -> bool {
        self.0 & event.bit() != 0
    }

    /// Adds `event`.
    pub fn insert(&mut self, event: Event) {
        self.0 |= event.bit();
    }

    /// Removes `event`.
    pub fn remove(&mut self, event: Event) {
        self.0 &= !event.bit();
    }

    /// The mask with `event` added.
    pub const fn with(self, event: Event) -> EventMask {
        EventMask(self.0 | event.bit())
    }

    /// Whether no bit is set.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Bits that are no valid event.
    pub const fn unknown_bits(self) -> u32 {
        self.0 & !EventMask::ALL.0
    }

    /// Every event whose lower-cased name contains `part`.
    fn matching(part: &str) -> EventMask {
        Event::ALL.into_iter().filter(|e| e.name().to_ascii_lowercase().contains(part)).collect()
    }

    /// The events in the mask, in protocol order.
    pub fn iter(self) -> impl Iterator<Item = Event> {
        Event::ALL.into_iter().filter(move |e| self.contains(*e))
    }
}

impl FromIterator<Event> for EventMask {
    fn from_iter<I: IntoIterator<Item = Event>>(iter: I) -> EventMask {
        let mut m = EventMask::EMPTY;
        for e in iter {
            m.insert(e);
        }
        m
    }
}

impl From<Event> for EventMask {
    fn from(e: Event) -> EventMask {
        EventMask(e.bit())
    }
}

impl std::ops::BitOr for EventMask {
    type Output = EventMask;
    fn bitor(self, rhs: EventMask) -> EventMask {
        EventMask(self.0 | rhs.0)
    }
}

impl std::ops::BitOr<Event> for EventMask {
    type Output = EventMask;
    fn bitor(self, rhs: Event) -> EventMask {
        self.with(rhs)
    }
}

impl std::ops::BitOr for Event {
    type Output = EventMask;
    fn bitor(self, rhs: Event) -> EventMask {
        EventMask::from(self).with(rhs)
    }
}

impl fmt::Display for EventMask {
    /// Comma-separated names, e.g. `RunPodSandbox,CreateContainer`; unknown bits as
    /// `unknown(0x…)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut sep = "";
        for e in self.iter() {
            write!(f, "{sep}{e}")?;
            sep = ",";
        }
        let unknown = self.unknown_bits();
        if unknown != 0 {
            write!(f, "{sep}unknown(0x{unknown:x})")?;
        }
        Ok(())
    }
}

impl FromStr for EventMask {
    type Err = UnknownEvent;

    /// Parses the Go stub's text form: comma-separated event names (case-insensitive), plus
    /// `all`, `pod`/`podsandbox` (every pod event) and `container` (every container event).
    /// Empty items are ignored.
    fn from_str(s: &str) -> Result<EventMask, UnknownEvent> {
        let mut mask = EventMask::EMPTY;
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let lc = item.to_ascii_lowercase();
            match lc.as_str() {
                "all" => mask = mask | EventMask::ALL,
                "pod" | "podsandbox" => mask = mask | EventMask::matching("pod"),
                "container" => mask = mask | EventMask::matching("container"),
                _ => mask.insert(item.parse()?),
            }
        }
        Ok(mask)
    }
}
