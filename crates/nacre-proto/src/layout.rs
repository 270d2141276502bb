//! File layouts: how a file's bytes are spread over objects, as Lustre's `lfs setstripe`
//! describes them.
//!
//! A layout is a list of components. Each covers an extent `[start, end)` of the file and
//! either stripes it RAID0 over OST objects or keeps it on the MDT (Data-on-MDT, DoM).
//! One component covering `[0, EOF)` is a plain layout; several make a progressive file
//! layout (PFL), where a file's first bytes can sit on the MDT or on one OST and its later
//! bytes on many. Overstriping lets a component place several objects on one OST.
//!
//! Layouts come from users (`lfs setstripe` options, [`Layout::from_lfs_args`]) and from
//! the network ([`Layout::decode`]), so neither is trusted. Decoding checks the bytes:
//! every length is bounded before anything is allocated, kinds and flags must be known,
//! and nothing may follow the message. [`Layout::validate`] checks the rules of a layout,
//! and each broken rule is a [`LayoutError`] that names the rule and the component.
//! Decoding does not validate, so a server can answer a bad layout with the rule it broke.
//!
//! # Wire format, version 1
//!
//! All integers are little-endian. Signed fields are sent as their two's-complement bits
//! in a `u32`.
//!
//! ```text
//! u8   version                 1
//! u32  component count         at most COMPONENTS_MAX (64)
//! per component:
//!   u64  start
//!   u64  end                   u64::MAX for EOF
//!   u8   kind                  1 = RAID0 stripes, 2 = data on the MDT (0 is never valid,
//!                              so a zeroed buffer does not decode)
//!   for kind 1 only:
//!     u32  stripe count        i32: -1 = all OSTs, 0 = default
//!     u64  stripe size         0 = default
//!     u32  stripe offset       i32: first OST index, -1 = any
//!     u8   overstripe          0 or 1
//!     u8   pool present        0 or 1
//!     if present:
//!       u32  pool name length  at most POOL_NAME_MAX (15)
//!       ...  pool name         UTF-8
//! ```

use std::fmt;

use crate::wire::{Dec, Enc, ProtoError};

const VERSION: u8 = 1;
const KIND_STRIPES: u8 = 1;
const KIND_MDT: u8 = 2;

/// Stripe sizes and component ends are multiples of this: 64 KiB, Lustre's smallest stripe
/// size. It is the largest page size clients run on, so a page never spans two stripes.
pub const STRIPE_SIZE_UNIT: u64 = 64 << 10;
/// The largest stripe size: the last multiple of 64 KiB below 4 GiB, because Lustre keeps
/// the stripe size in 32 bits.
pub const STRIPE_SIZE_MAX: u64 = (4 << 30) - STRIPE_SIZE_UNIT;
/// The stripe size used when no layout and no default sets one: 1 MiB, as in Lustre.
pub const DEFAULT_STRIPE_SIZE: u64 = 1 << 20;
/// The stripe count used when no layout and no default sets one: 1, as in Lustre.
pub const DEFAULT_STRIPE_COUNT: i32 = 1;
/// The most stripes one component may have (Lustre's `LOV_MAX_STRIPE_COUNT`).
pub const STRIPE_COUNT_MAX: i32 = 2000;
/// The most components one layout may have. This bounds how much a decoder allocates and
/// how long a lookup by offset takes.
pub const COMPONENTS_MAX: usize = 64;
/// The longest OST pool name, in bytes (Lustre's `LOV_MAXPOOLNAME`).
pub const POOL_NAME_MAX: usize = 15;
/// The largest Data-on-MDT component, 1 GiB. Small files belong on the MDT; large ones
/// would fill it.
pub const DOM_SIZE_MAX: u64 = 1 << 30;
/// The end of a component that reaches the end of the file, however large the file grows.
pub const EOF: u64 = u64::MAX;

/// A file's layout: components that cover the file from byte 0, each one starting where
/// the one before it ends. A plain layout is one component covering `[0, EOF)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// The components, in file order.
    pub components: Vec<Component>,
}

/// One component of a layout: the extent `[start, end)` of the file and where its bytes
/// are kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Component {
    /// The first byte the component covers.
    pub start: u64,
    /// The first byte after the component, or [`EOF`] if it reaches the end of the file.
    pub end: u64,
    /// Where the component's bytes are kept.
    pub kind: Kind,
}

/// Where a component's bytes are kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// RAID0 stripes over OST objects.
    Stripes(Striping),
    /// Data on the MDT (DoM), in the file's inode. The whole component is one stripe, so its
    /// stripe size is its end. If a layout has only a DoM component, a write past its end
    /// fails with EFBIG. That is what Lustre does for `lfs setstripe -E 1M -L mdt`.
    Mdt,
}

/// How a component is striped over OST objects. A zero count or size means "not set": it
/// is taken from the default (see [`Layout::fill_defaults`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Striping {
    /// The number of objects. -1 means one per OST, 0 means the default, and any other
    /// value is 1..=[`STRIPE_COUNT_MAX`]. With `overstripe` it may exceed the number of OSTs.
    pub count: i32,
    /// Bytes per stripe. 0 means the default; any other value is a multiple of
    /// [`STRIPE_SIZE_UNIT`] up to [`STRIPE_SIZE_MAX`].
    pub size: u64,
    /// The index of the OST that holds the first object, or -1 to let the MDS choose.
    pub offset: i32,
    /// The OST pool objects are allocated from, if any.
    pub pool: Option<String>,
    /// Overstriping: an OST may hold several of the component's objects.
    pub overstripe: bool,
}

impl Default for Striping {
    /// Nothing set: default count and size, any OST, no pool.
    fn default() -> Striping {
        Striping { count: 0, size: 0, offset: -1, pool: None, overstripe: false }
    }
}

impl Striping {
    /// Lustre's built-in file system default: one 1 MiB stripe on any OST.
    pub fn fs_default() -> Striping {
        Striping { count: DEFAULT_STRIPE_COUNT, size: DEFAULT_STRIPE_SIZE, ..Striping::default() }
    }

    /// Take the count and the size from `default` where they are not set (0). The offset
    /// and the pool are left alone: -1 and no pool are real choices, not gaps.
    pub fn fill_defaults(&mut self, default: &Striping) {
        if self.count == 0 {
            self.count = default.count;
        }
        if self.size == 0 {
            self.size = default.size;
        }
    }

    /// Check this striping's own rules; `index` is its component's index, for the error.
    fn validate(&self, index: usize) -> Result<(), LayoutError> {
        if !(-1..=STRIPE_COUNT_MAX).contains(&self.count) {
            return Err(LayoutError::StripeCount { index, count: self.count });
        }
        if !self.size.is_multiple_of(STRIPE_SIZE_UNIT) {
            return Err(LayoutError::StripeSizeNotAligned { index, size: self.size });
        }
        if self.size > STRIPE_SIZE_MAX {
            return Err(LayoutError::StripeSizeTooLarge { index, size: self.size });
        }
        if self.offset < -1 {
            return Err(LayoutError::StripeOffset { index, offset: self.offset });
        }
        if self.overstripe && self.count == 0 {
            return Err(LayoutError::OverstripeWithoutCount { index });
        }
        if let Some(pool) = &self.pool {
            if pool.is_empty() {
                return Err(LayoutError::PoolEmpty { index });
            }
            if pool.len() > POOL_NAME_MAX {
                return Err(LayoutError::PoolTooLong { index, pool: pool.clone() });
            }
            if let Some(ch) = pool.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))) {
                return Err(LayoutError::PoolChar { index, pool: pool.clone(), ch });
            }
        }
        Ok(())
    }
}

/// A layout rule that is broken, or an `lfs setstripe` argument that cannot be read.
/// `index` is always the index of the component in [`Layout::components`], counting from 0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LayoutError {
    /// The layout has no components.
    NoComponents,
    /// The layout has more than [`COMPONENTS_MAX`] components.
    TooManyComponents { count: usize },
    /// The component does not start where the one before it ends (or at 0 if it is first).
    Start { index: usize, start: u64, want: u64 },
    /// The component ends at or before its start.
    Empty { index: usize, start: u64, end: u64 },
    /// The component reaches EOF but is not the last.
    EofNotLast { index: usize },
    /// The last component stops before EOF. Only a layout with just a DoM component may
    /// do that.
    LastNotEof { index: usize, end: u64 },
    /// The component ends at a byte that is not a multiple of [`STRIPE_SIZE_UNIT`].
    EndNotAligned { index: usize, end: u64 },
    /// The component ends at a byte that is not a multiple of its stripe size.
    EndNotStripeAligned { index: usize, end: u64, size: u64 },
    /// The stripe size is not a multiple of [`STRIPE_SIZE_UNIT`].
    StripeSizeNotAligned { index: usize, size: u64 },
    /// The stripe size is above [`STRIPE_SIZE_MAX`].
    StripeSizeTooLarge { index: usize, size: u64 },
    /// The stripe count is outside -1..=[`STRIPE_COUNT_MAX`].
    StripeCount { index: usize, count: i32 },
    /// The stripe offset (first OST index) is below -1.
    StripeOffset { index: usize, offset: i32 },
    /// Overstriping is asked for with the stripe count not set.
    OverstripeWithoutCount { index: usize },
    /// The pool name is empty.
    PoolEmpty { index: usize },
    /// The pool name is longer than [`POOL_NAME_MAX`] bytes.
    PoolTooLong { index: usize, pool: String },
    /// The pool name has a character that is not a letter, a digit, `_`, `.` or `-`.
    PoolChar { index: usize, pool: String, ch: char },
    /// A DoM component that is not the first one.
    DomNotFirst { index: usize },
    /// A DoM component that ends past [`DOM_SIZE_MAX`].
    DomTooLarge { index: usize, end: u64 },
    /// An `lfs setstripe` option this parser does not know.
    UnknownOption { option: String },
    /// An argument that is not an option. Pass only the options, without the file name.
    UnexpectedArgument { arg: String },
    /// An option that needs a value was the last argument.
    MissingValue { option: String },
    /// An option's value is not an integer that fits in 32 bits.
    BadNumber { option: String, value: String },
    /// An option's value is not a size.
    BadSize { option: String, value: String },
    /// `-L` with a value other than `mdt` or `raid0`.
    BadLayoutKind { option: String, value: String },
    /// An option sets something for a component that an earlier option already set.
    RepeatedOption { index: usize, option: String, earlier: String },
    /// Options came before the first `-E`, and then an `-E` came. Either use no `-E` (a plain
    /// layout), or start every component with `-E`.
    OptionBeforeFirstEnd { option: String },
    /// A striping option on a DoM component.
    DomOption { index: usize, option: String },
    /// A stripe size given for a DoM component that is not the component's end.
    DomStripeSize { index: usize, size: u64, end: u64 },
}

/// A component end as `lfs getstripe` prints it: a byte count, or `EOF`.
struct End(u64);

impl fmt::Display for End {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 == EOF { write!(f, "EOF") } else { write!(f, "{}", self.0) }
    }
}

impl fmt::Display for LayoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use LayoutError::*;
        match self {
            NoComponents => write!(f, "the layout has no components"),
            TooManyComponents { count } => write!(f, "the layout has {count} components; at most {COMPONENTS_MAX}"),
            Start { index: 0, start, .. } => write!(f, "component 0: starts at {start}; the first must start at 0"),
            Start { index, start, want } => {
                write!(f, "component {index}: starts at {start}, but the previous component ends at {}", End(*want))
            }
            Empty { index, start, end } => {
                write!(
                    f,
                    "component {index}: ends at {} but starts at {start}; the end must be after the start",
                    End(*end)
                )
            }
            EofNotLast { index } => write!(f, "component {index}: reaches EOF but is not the last component"),
            LastNotEof { index, end } => write!(
                f,
                "component {index}: ends at {end}; the last component must reach EOF (only a layout of one \
                 Data-on-MDT component may stop before)"
            ),
            EndNotAligned { index, end } => write!(f, "component {index}: end {end} is not a multiple of 64 KiB"),
            EndNotStripeAligned { index, end, size } => {
                write!(f, "component {index}: end {end} is not a multiple of its stripe size {size}")
            }
            StripeSizeNotAligned { index, size } => {
                write!(f, "component {index}: stripe size {size} is not a multiple of 64 KiB")
            }
            StripeSizeTooLarge { index, size } => {
                write!(f, "component {index}: stripe size {size} is larger than the maximum {STRIPE_SIZE_MAX}")
            }
            StripeCount { index, count } => {
                write!(f, "component {index}: stripe count {count} is outside -1..={STRIPE_COUNT_MAX}")
            }
            StripeOffset { index, offset } => {
                write!(f, "component {index}: stripe offset {offset} is below -1 (-1 means any OST)")
            }
            OverstripeWithoutCount { index } => {
                write!(f, "component {index}: overstriping needs a stripe count, and the count is not set")
            }
            PoolEmpty { index } => write!(f, "component {index}: the pool name is empty"),
            PoolTooLong { index, pool } => {
                write!(f, "component {index}: pool name {pool:?} is {} bytes; at most {POOL_NAME_MAX}", pool.len())
            }
            PoolChar { index, pool, ch } => write!(
                f,
                "component {index}: pool name {pool:?} has the character {ch:?}; only letters, digits, '_', '.' \
                 and '-' are allowed"
            ),
            DomNotFirst { index } => {
                write!(f, "component {index}: a Data-on-MDT component must be the first component")
            }
            DomTooLarge { index, end } => write!(
                f,
                "component {index}: a Data-on-MDT component ends at {}; it may end at most at {DOM_SIZE_MAX} (1 GiB)",
                End(*end)
            ),
            UnknownOption { option } => write!(f, "unknown option {option:?}"),
            UnexpectedArgument { arg } => {
                write!(f, "unexpected argument {arg:?}; give only options, without the file name")
            }
            MissingValue { option } => write!(f, "option {option} needs a value"),
            BadNumber { option, value } => write!(f, "option {option}: {value:?} is not a 32-bit integer"),
            BadSize { option, value } => write!(
                f,
                "option {option}: {value:?} is not a size (bytes, or a number with a K, M, G or T suffix, \
                 below 16 EiB)"
            ),
            BadLayoutKind { option, value } => {
                write!(f, "option {option}: {value:?} is not a layout; use mdt or raid0")
            }
            RepeatedOption { index, option, earlier } => {
                write!(f, "component {index}: {option} sets what {earlier} already set")
            }
            OptionBeforeFirstEnd { option } => write!(
                f,
                "option {option} comes before the first -E; with -E, every component must start with its own -E"
            ),
            DomOption { index, option } => {
                write!(f, "component {index}: option {option} does not apply to a Data-on-MDT component")
            }
            DomStripeSize { index, size, end } => write!(
                f,
                "component {index}: stripe size {size} of a Data-on-MDT component must be its end, {}",
                End(*end)
            ),
        }
    }
}

impl std::error::Error for LayoutError {}

impl Layout {
    /// A plain layout: one component covering the whole file, striped as `striping`.
    pub fn plain(striping: Striping) -> Layout {
        Layout { components: vec![Component { start: 0, end: EOF, kind: Kind::Stripes(striping) }] }
    }

    /// The layout a new file gets when it asks for none. Lustre gives it the directory's
    /// default layout if there is one, else the file system default as a plain layout.
    /// Any count or size left unset in either one is taken from `fs_default`.
    pub fn inherited(dir_default: Option<&Layout>, fs_default: &Striping) -> Layout {
        let mut layout = dir_default.cloned().unwrap_or_else(|| Layout::plain(fs_default.clone()));
        layout.fill_defaults(fs_default);
        layout
    }

    /// Fill each striped component's unset count and size (zeros) from `fs_default`, the
    /// way `lfs setstripe` with some options left out takes them from the default. If
    /// `fs_default` has zeros too, those fields stay unset. Validate again afterwards,
    /// because an inherited stripe size might not divide a component's end.
    pub fn fill_defaults(&mut self, fs_default: &Striping) {
        for c in &mut self.components {
            if let Kind::Stripes(s) = &mut c.kind {
                s.fill_defaults(fs_default);
            }
        }
    }

    /// Check every rule of a layout. The error names the first rule broken and the
    /// component that breaks it.
    pub fn validate(&self) -> Result<(), LayoutError> {
        let n = self.components.len();
        if n == 0 {
            return Err(LayoutError::NoComponents);
        }
        if n > COMPONENTS_MAX {
            return Err(LayoutError::TooManyComponents { count: n });
        }
        let mut previous_end = 0;
        for (index, c) in self.components.iter().enumerate() {
            let (start, end) = (c.start, c.end);
            if start != previous_end {
                return Err(LayoutError::Start { index, start, want: previous_end });
            }
            if end <= start {
                return Err(LayoutError::Empty { index, start, end });
            }
            if end == EOF && index + 1 < n {
                return Err(LayoutError::EofNotLast { index });
            }
            match &c.kind {
                Kind::Stripes(s) => s.validate(index)?,
                Kind::Mdt if index != 0 => return Err(LayoutError::DomNotFirst { index }),
                Kind::Mdt => {}
            }
            if end != EOF && !end.is_multiple_of(STRIPE_SIZE_UNIT) {
                return Err(LayoutError::EndNotAligned { index, end });
            }
            match &c.kind {
                Kind::Stripes(s) if end != EOF && s.size != 0 && !end.is_multiple_of(s.size) => {
                    return Err(LayoutError::EndNotStripeAligned { index, end, size: s.size });
                }
                Kind::Mdt if end > DOM_SIZE_MAX => return Err(LayoutError::DomTooLarge { index, end }),
                _ => {}
            }
            previous_end = end;
        }
        let last = &self.components[n - 1];
        let dom_only = n == 1 && last.kind == Kind::Mdt;
        if last.end != EOF && !dom_only {
            return Err(LayoutError::LastNotEof { index: n - 1, end: last.end });
        }
        Ok(())
    }

    /// The component holding byte `offset` of the file, with its index. `None` if no
    /// component covers it (past the end of a DoM-only layout, or an invalid layout).
    pub fn component_at(&self, offset: u64) -> Option<(usize, &Component)> {
        self.components.iter().enumerate().find(|(_, c)| c.start <= offset && (offset < c.end || c.end == EOF))
    }

    /// The layout as a message body (the format is in this module's header). Any layout is
    /// encoded exactly, valid or not.
    pub fn encode(&self) -> Vec<u8> {
        // More than u32::MAX components or pool bytes cannot fit in memory. Saturating keeps
        // the body one that `decode` refuses, so nothing is cut silently.
        let len32 = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        let mut e = Enc::new(VERSION).u32(len32(self.components.len()));
        for c in &self.components {
            e = e.u64(c.start).u64(c.end);
            match &c.kind {
                Kind::Mdt => e = e.u8(KIND_MDT),
                Kind::Stripes(s) => {
                    // Signed fields go as their two's-complement bits.
                    e = e
                        .u8(KIND_STRIPES)
                        .u32(s.count as u32)
                        .u64(s.size)
                        .u32(s.offset as u32)
                        .u8(s.overstripe as u8)
                        .u8(s.pool.is_some() as u8);
                    if let Some(pool) = &s.pool {
                        e = e.bytes(pool.as_bytes());
                    }
                }
            }
        }
        e.done()
    }

    /// Read a layout from a message body. A short body, bytes after the end, an unknown
    /// kind or flag, or a length over its bound is an error. The layout's rules are not
    /// checked here; call [`Layout::validate`].
    pub fn decode(b: &[u8]) -> Result<Layout, ProtoError> {
        let mut d = Dec::new(b, "layout", VERSION)?;
        let n = d.u32("component count")?;
        if n > COMPONENTS_MAX as u32 {
            return Err(ProtoError::Invalid(format!("layout of {n} components; at most {COMPONENTS_MAX}")));
        }
        let mut components = Vec::with_capacity(n as usize);
        for index in 0..n {
            let start = d.u64("component start")?;
            let end = d.u64("component end")?;
            let kind = match d.u8("component kind")? {
                KIND_MDT => Kind::Mdt,
                KIND_STRIPES => {
                    let count = d.u32("stripe count")? as i32;
                    let size = d.u64("stripe size")?;
                    let offset = d.u32("stripe offset")? as i32;
                    let overstripe = get_flag(&mut d, index, "overstripe flag")?;
                    let pool =
                        if get_flag(&mut d, index, "pool flag")? { Some(get_pool(&mut d, index)?) } else { None };
                    Kind::Stripes(Striping { count, size, offset, pool, overstripe })
                }
                other => {
                    return Err(ProtoError::Invalid(format!(
                        "component {index}: kind {other} is unknown ({KIND_STRIPES} is RAID0 stripes, {KIND_MDT} is \
                         data on the MDT)"
                    )));
                }
            };
            components.push(Component { start, end, kind });
        }
        d.end()?;
        Ok(Layout { components })
    }

    /// Read the options of `lfs setstripe` (without the file name) into a layout, and
    /// validate it.
    ///
    /// Options: `-c`/`--stripe-count N`, `-S`/`--stripe-size SIZE`, `-i`/`--stripe-index
    /// IDX`, `-p`/`--pool NAME`, `-C`/`--overstripe-count N` (count N with overstriping),
    /// `-L`/`--layout mdt|raid0` and `-E`/`--component-end END`. Long options also take
    /// `--name=value`. A SIZE is a byte count with an optional K, M, G or T suffix, in either
    /// case. An END is a SIZE, or `-1` or `eof` for EOF. Each `-E` starts a new component,
    /// and the options after it belong to that component. Without any `-E`, the options
    /// make a plain layout covering `[0, EOF)`. Each component may set each thing once.
    pub fn from_lfs_args(args: &[&str]) -> Result<Layout, LayoutError> {
        let mut done: Vec<Pending> = Vec::new();
        let mut current = Pending::new(EOF);
        let mut composite = false;
        // The first option given before any -E, so that a later -E can name it.
        let mut before_first_end: Option<&str> = None;
        let mut i = 0;
        while let Some(&arg) = args.get(i) {
            i += 1;
            let (name, inline) = match arg.split_once('=') {
                Some((name, value)) if arg.starts_with("--") => (name, Some(value)),
                _ => (arg, None),
            };
            let opt = match name {
                "-c" | "--stripe-count" => Opt::Count,
                "-C" | "--overstripe-count" => Opt::Overstripe,
                "-S" | "--stripe-size" => Opt::Size,
                "-i" | "--stripe-index" => Opt::Index,
                "-p" | "--pool" => Opt::Pool,
                "-L" | "--layout" => Opt::Layout,
                "-E" | "--component-end" => Opt::End,
                _ if name.starts_with('-') => return Err(LayoutError::UnknownOption { option: name.into() }),
                _ => return Err(LayoutError::UnexpectedArgument { arg: arg.into() }),
            };
            let value = match inline {
                Some(value) => value,
                None => {
                    let value = args.get(i).ok_or_else(|| LayoutError::MissingValue { option: name.into() })?;
                    i += 1;
                    value
                }
            };
            if opt == Opt::End {
                let end = parse_end(name, value)?;
                if composite {
                    done.push(std::mem::replace(&mut current, Pending::new(end)));
                } else if let Some(option) = before_first_end {
                    return Err(LayoutError::OptionBeforeFirstEnd { option: option.into() });
                } else {
                    current = Pending::new(end);
                }
                composite = true;
                continue;
            }
            if !composite && before_first_end.is_none() {
                before_first_end = Some(name);
            }
            current.set(done.len(), opt, name, value)?;
        }
        done.push(current);
        let mut components = Vec::with_capacity(done.len());
        let mut start = 0;
        for (index, pending) in done.into_iter().enumerate() {
            let c = pending.finish(index, start)?;
            start = c.end;
            components.push(c);
        }
        let layout = Layout { components };
        layout.validate()?;
        Ok(layout)
    }
}

/// Where byte `offset` of a file lives inside a RAID0 component that starts at `start`,
/// with stripes of `size` bytes over `count` objects. The answer is the stripe (object)
/// index within the component, and the offset in that object. As in Lustre, an object
/// holds only its own component's bytes, so object offsets count from the component's
/// start.
///
/// `size` and `count` must be resolved (not 0, not -1), and `offset` must be at or past
/// `start`. Anything else is a bug in the caller, and this panics naming it.
pub fn stripe_of(start: u64, size: u64, count: u32, offset: u64) -> (u32, u64) {
    assert!(size > 0 && count > 0, "stripe_of needs a resolved stripe size and count, got {size} and {count}");
    assert!(offset >= start, "stripe_of: offset {offset} is before the component's start {start}");
    let within = offset - start;
    let stripe = within / size;
    let count = u64::from(count);
    // The remainder is below `count`, which is a u32.
    ((stripe % count) as u32, stripe / count * size + within % size)
}

impl fmt::Display for Layout {
    /// The layout as `lfs getstripe` prints a composite file, without the fields Nacre
    /// does not keep (layout generation, mirrors, flags, objects). Component ids count from
    /// 1, as in Lustre, so `lcme_id` is the component's index plus one. Values are printed
    /// as stored: an unset count or size shows as 0.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "lcm_entry_count:   {}", self.components.len())?;
        for (index, c) in self.components.iter().enumerate() {
            if index > 0 {
                writeln!(f)?;
            }
            writeln!(f, "  lcme_id:             {}", index + 1)?;
            writeln!(f, "  lcme_extent.e_start: {}", c.start)?;
            writeln!(f, "  lcme_extent.e_end:   {}", End(c.end))?;
            match &c.kind {
                Kind::Mdt => {
                    writeln!(f, "    lmm_stripe_count:  0")?;
                    writeln!(f, "    lmm_stripe_size:   {}", End(c.end))?;
                    writeln!(f, "    lmm_pattern:       mdt")?;
                }
                Kind::Stripes(s) => {
                    writeln!(f, "    lmm_stripe_count:  {}", s.count)?;
                    writeln!(f, "    lmm_stripe_size:   {}", s.size)?;
                    writeln!(f, "    lmm_pattern:       {}", if s.overstripe { "raid0,overstriped" } else { "raid0" })?;
                    writeln!(f, "    lmm_stripe_offset: {}", s.offset)?;
                    if let Some(pool) = &s.pool {
                        writeln!(f, "    lmm_pool:          {pool}")?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// A 0-or-1 byte. Any other value is refused, so each layout has exactly one encoding.
fn get_flag(d: &mut Dec<'_>, index: u32, what: &'static str) -> Result<bool, ProtoError> {
    match d.u8(what)? {
        0 => Ok(false),
        1 => Ok(true),
        other => Err(ProtoError::Invalid(format!("component {index}: {what} is {other}, not 0 or 1"))),
    }
}

/// A pool name: its length, bounded before any byte is read, then UTF-8 bytes.
fn get_pool(d: &mut Dec<'_>, index: u32) -> Result<String, ProtoError> {
    d.str("pool name", POOL_NAME_MAX).map(str::to_string).map_err(|e| match e {
        ProtoError::Invalid(m) => ProtoError::Invalid(format!("component {index}: {m}")),
        other => other,
    })
}

/// The `lfs setstripe` options this parser knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Opt {
    Count,
    Overstripe,
    Size,
    Index,
    Pool,
    Layout,
    End,
}

/// A value an option set, with the option as it was typed, for error messages.
struct Given<T> {
    value: T,
    option: String,
}

/// A component being read from `lfs setstripe` options.
struct Pending {
    end: u64,
    /// The count, and whether it came with overstriping (`-C`).
    count: Option<Given<(i32, bool)>>,
    size: Option<Given<u64>>,
    index: Option<Given<i32>>,
    pool: Option<Given<String>>,
    /// Whether the layout is `mdt` (true) or `raid0` (false).
    mdt: Option<Given<bool>>,
}

impl Pending {
    fn new(end: u64) -> Pending {
        Pending { end, count: None, size: None, index: None, pool: None, mdt: None }
    }

    /// Apply one option (other than `-E`) to component `index`.
    fn set(&mut self, index: usize, opt: Opt, option: &str, value: &str) -> Result<(), LayoutError> {
        match opt {
            Opt::Count => give(&mut self.count, (parse_int(option, value)?, false), option, index),
            Opt::Overstripe => give(&mut self.count, (parse_int(option, value)?, true), option, index),
            Opt::Size => give(&mut self.size, parse_size(option, value)?, option, index),
            Opt::Index => give(&mut self.index, parse_int(option, value)?, option, index),
            Opt::Pool => give(&mut self.pool, value.to_string(), option, index),
            Opt::Layout => {
                let mdt = match value.to_ascii_lowercase().as_str() {
                    "mdt" => true,
                    "raid0" => false,
                    _ => return Err(LayoutError::BadLayoutKind { option: option.into(), value: value.into() }),
                };
                give(&mut self.mdt, mdt, option, index)
            }
            // -E starts a new component and is handled by the caller.
            Opt::End => unreachable!("-E is not a per-component option"),
        }
    }

    /// The component `index`, starting at `start`.
    fn finish(self, index: usize, start: u64) -> Result<Component, LayoutError> {
        let kind = if self.mdt.is_some_and(|g| g.value) {
            let striping_option = [
                self.count.as_ref().map(|g| &g.option),
                self.index.as_ref().map(|g| &g.option),
                self.pool.as_ref().map(|g| &g.option),
            ];
            if let Some(option) = striping_option.into_iter().flatten().next() {
                return Err(LayoutError::DomOption { index, option: option.clone() });
            }
            if let Some(size) = self.size
                && size.value != self.end
            {
                return Err(LayoutError::DomStripeSize { index, size: size.value, end: self.end });
            }
            Kind::Mdt
        } else {
            let (count, overstripe) = self.count.map_or((0, false), |g| g.value);
            Kind::Stripes(Striping {
                count,
                size: self.size.map_or(0, |g| g.value),
                offset: self.index.map_or(-1, |g| g.value),
                pool: self.pool.map(|g| g.value),
                overstripe,
            })
        };
        Ok(Component { start, end: self.end, kind })
    }
}

/// Record what `option` set, unless an earlier option of the component already set it.
fn give<T>(slot: &mut Option<Given<T>>, value: T, option: &str, index: usize) -> Result<(), LayoutError> {
    if let Some(earlier) = slot {
        return Err(LayoutError::RepeatedOption { index, option: option.into(), earlier: earlier.option.clone() });
    }
    *slot = Some(Given { value, option: option.into() });
    Ok(())
}

fn parse_int(option: &str, value: &str) -> Result<i32, LayoutError> {
    value.parse().map_err(|_| LayoutError::BadNumber { option: option.into(), value: value.into() })
}

/// A byte count with an optional K, M, G or T suffix (powers of 1024), in either case.
fn parse_size(option: &str, value: &str) -> Result<u64, LayoutError> {
    let bad = || LayoutError::BadSize { option: option.into(), value: value.into() };
    let (digits, shift) = match value.as_bytes().last().map(u8::to_ascii_lowercase) {
        Some(b'k') => (&value[..value.len() - 1], 10),
        Some(b'm') => (&value[..value.len() - 1], 20),
        Some(b'g') => (&value[..value.len() - 1], 30),
        Some(b't') => (&value[..value.len() - 1], 40),
        _ => (value, 0),
    };
    // Digits only: u64's parser would also take a leading '+'.
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let n: u64 = digits.parse().map_err(|_| bad())?;
    n.checked_mul(1 << shift).ok_or_else(bad)
}

/// A component end: a size, or `-1` or `eof` (either case) for EOF.
fn parse_end(option: &str, value: &str) -> Result<u64, LayoutError> {
    if value == "-1" || value.eq_ignore_ascii_case("eof") { Ok(EOF) } else { parse_size(option, value) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// xorshift64: tiny, seeded, good enough to pick offsets.
    struct Rng(u64);

    impl Rng {
        fn new(seed: u64) -> Rng {
            // xorshift never leaves 0.
            Rng(seed | 1)
        }
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    fn seed(test: &str) -> u64 {
        let seed = std::env::var("NACRE_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
        });
        eprintln!("{test}: seed {seed} (rerun with NACRE_SEED={seed})");
        seed
    }

    const K: u64 = 1 << 10;
    const M: u64 = 1 << 20;
    const G: u64 = 1 << 30;

    fn stripes(start: u64, end: u64, count: i32, size: u64) -> Component {
        Component { start, end, kind: Kind::Stripes(Striping { count, size, ..Striping::default() }) }
    }

    fn striping(count: i32, size: u64) -> Striping {
        Striping { count, size, ..Striping::default() }
    }

    fn dom(end: u64) -> Component {
        Component { start: 0, end, kind: Kind::Mdt }
    }

    fn layout(components: Vec<Component>) -> Layout {
        Layout { components }
    }

    /// A PFL layout of DoM then two striped components, one with a pool and overstriping.
    fn pfl() -> Layout {
        let mut last = striping(-1, 4 * M);
        last.pool = Some("flash".into());
        let mut middle = striping(8, M);
        middle.overstripe = true;
        middle.offset = 3;
        layout(vec![
            dom(M),
            Component { start: M, end: 64 * M, kind: Kind::Stripes(middle) },
            Component { start: 64 * M, end: EOF, kind: Kind::Stripes(last) },
        ])
    }

    fn error(l: &Layout) -> String {
        match l.validate() {
            Ok(()) => panic!("{l:?} validated"),
            Err(e) => e.to_string(),
        }
    }

    /// Asserts the error names every one of `parts`.
    fn assert_names(message: &str, parts: &[&str]) {
        for part in parts {
            assert!(message.contains(part), "{message:?} does not name {part:?}");
        }
    }

    #[test]
    fn good_layouts_validate_including_every_bound() {
        let good = [
            Layout::plain(Striping::default()),
            Layout::plain(Striping::fs_default()),
            Layout::plain(striping(-1, STRIPE_SIZE_MAX)),
            Layout::plain(striping(STRIPE_COUNT_MAX, STRIPE_SIZE_UNIT)),
            Layout::plain(Striping { count: -1, overstripe: true, ..Striping::default() }),
            Layout::plain(Striping { pool: Some("a".repeat(POOL_NAME_MAX)), ..Striping::default() }),
            Layout::plain(Striping { pool: Some("Az09_.-".into()), ..Striping::default() }),
            pfl(),
            // DoM alone: a file past its end gets EFBIG, as in Lustre.
            layout(vec![dom(STRIPE_SIZE_UNIT)]),
            layout(vec![dom(DOM_SIZE_MAX)]),
            layout(vec![dom(DOM_SIZE_MAX), stripes(DOM_SIZE_MAX, EOF, 1, 0)]),
            // An end that is a multiple of 64 KiB; the stripe size is unset.
            layout(vec![stripes(0, 192 * K, 1, 0), stripes(192 * K, EOF, 1, 0)]),
            // Exactly COMPONENTS_MAX components.
            layout(
                (0..COMPONENTS_MAX as u64)
                    .map(|i| stripes(i * M, if i + 1 == COMPONENTS_MAX as u64 { EOF } else { (i + 1) * M }, 1, M))
                    .collect(),
            ),
        ];
        for l in good {
            assert_eq!(l.validate(), Ok(()), "{l:?}");
        }
    }

    #[test]
    fn every_rule_is_named_with_its_component() {
        let many =
            |n: u64| layout((0..n).map(|i| stripes(i * M, if i + 1 == n { EOF } else { (i + 1) * M }, 1, M)).collect());
        let pool = |name: &str| Layout::plain(Striping { pool: Some(name.into()), ..Striping::default() });
        let cases: Vec<(Layout, &[&str])> = vec![
            (layout(vec![]), &["no components"]),
            (many(COMPONENTS_MAX as u64 + 1), &["65 components", "at most 64"]),
            (layout(vec![stripes(64 * K, EOF, 1, 0)]), &["component 0", "starts at 65536", "must start at 0"]),
            (
                layout(vec![stripes(0, M, 1, 0), stripes(2 * M, EOF, 1, 0)]),
                &["component 1", "starts at 2097152", "previous component ends at 1048576"],
            ),
            (
                layout(vec![stripes(0, 2 * M, 1, 0), stripes(M, EOF, 1, 0)]),
                &["component 1", "starts at 1048576", "previous component ends at 2097152"],
            ),
            (
                layout(vec![stripes(0, M, 1, 0), stripes(M, M, 1, 0), stripes(M, EOF, 1, 0)]),
                &["component 1", "ends at 1048576 but starts at 1048576"],
            ),
            (
                layout(vec![stripes(0, EOF, 1, 0), stripes(EOF, EOF, 1, 0)]),
                &["component 0", "reaches EOF but is not the last"],
            ),
            (
                layout(vec![stripes(0, M, 1, 0), stripes(M, 64 * M, 1, 0)]),
                &["component 1", "ends at 67108864", "the last component must reach EOF"],
            ),
            (layout(vec![stripes(0, 64 * M, 1, 0)]), &["component 0", "the last component must reach EOF"]),
            (layout(vec![dom(M), stripes(M, 2 * M, 1, 0)]), &["component 1", "the last component must reach EOF"]),
            (
                layout(vec![stripes(0, 100 * K, 1, 0), stripes(100 * K, EOF, 1, 0)]),
                &["component 0", "end 102400 is not a multiple of 64 KiB"],
            ),
            (
                layout(vec![stripes(0, 6 * M, 1, 4 * M), stripes(6 * M, EOF, 1, 0)]),
                &["component 0", "end 6291456 is not a multiple of its stripe size 4194304"],
            ),
            (Layout::plain(striping(1, 100_000)), &["component 0", "stripe size 100000 is not a multiple of 64 KiB"]),
            (
                Layout::plain(striping(1, STRIPE_SIZE_MAX + STRIPE_SIZE_UNIT)),
                &["component 0", "stripe size 4294967296 is larger than the maximum 4294901760"],
            ),
            (Layout::plain(striping(-2, 0)), &["component 0", "stripe count -2 is outside -1..=2000"]),
            (
                layout(vec![stripes(0, M, 1, 0), stripes(M, EOF, STRIPE_COUNT_MAX + 1, 0)]),
                &["component 1", "stripe count 2001 is outside -1..=2000"],
            ),
            (
                Layout::plain(Striping { offset: -2, ..Striping::default() }),
                &["component 0", "stripe offset -2 is below -1"],
            ),
            (
                Layout::plain(Striping { overstripe: true, ..Striping::default() }),
                &["component 0", "overstriping needs a stripe count"],
            ),
            (pool(""), &["component 0", "pool name is empty"]),
            (pool(&"p".repeat(POOL_NAME_MAX + 1)), &["component 0", "is 16 bytes; at most 15"]),
            (pool("fl/ash"), &["component 0", "pool name \"fl/ash\"", "'/'"]),
            (pool("fl ash"), &["component 0", "' '"]),
            (
                layout(vec![
                    stripes(0, M, 1, 0),
                    Component { start: M, end: 2 * M, kind: Kind::Mdt },
                    stripes(2 * M, EOF, 1, 0),
                ]),
                &["component 1", "Data-on-MDT component must be the first"],
            ),
            (
                layout(vec![dom(DOM_SIZE_MAX + STRIPE_SIZE_UNIT), stripes(DOM_SIZE_MAX + STRIPE_SIZE_UNIT, EOF, 1, 0)]),
                &["component 0", "Data-on-MDT component ends at 1073807360", "at most at 1073741824"],
            ),
            (layout(vec![dom(EOF)]), &["component 0", "Data-on-MDT component ends at EOF"]),
            (layout(vec![dom(100 * K)]), &["component 0", "end 102400 is not a multiple of 64 KiB"]),
        ];
        for (l, parts) in cases {
            assert_names(&error(&l), parts);
        }
    }

    #[test]
    fn layouts_round_trip_and_every_cut_is_an_error() {
        let all = [
            pfl(),
            Layout::plain(Striping::default()),
            Layout::plain(Striping { count: -1, size: 0, offset: 7, pool: Some(String::new()), overstripe: false }),
            layout(vec![dom(M)]),
            // Encoding is exact even for layouts that do not validate.
            layout(vec![]),
            layout(vec![stripes(5, 3, i32::MIN, u64::MAX)]),
        ];
        for l in all {
            let body = l.encode();
            assert_eq!(Layout::decode(&body), Ok(l.clone()));
            for cut in 0..body.len() {
                assert!(
                    matches!(Layout::decode(&body[..cut]), Err(ProtoError::Truncated { .. })),
                    "{l:?} cut at {cut} decoded"
                );
            }
            let mut longer = body.clone();
            longer.push(0);
            assert_eq!(Layout::decode(&longer), Err(ProtoError::Trailing { extra: 1 }));
            let mut newer = body.clone();
            newer[0] = VERSION + 1;
            assert!(matches!(Layout::decode(&newer), Err(ProtoError::Version { got: 2, .. })));
        }
    }

    #[test]
    fn bad_bodies_are_refused_with_what_is_wrong() {
        let invalid = |b: &[u8]| match Layout::decode(b) {
            Err(ProtoError::Invalid(m)) => m,
            other => panic!("{b:?} gave {other:?}"),
        };
        // Counts over the bound are refused before anything is allocated.
        for n in [COMPONENTS_MAX as u32 + 1, u32::MAX] {
            assert_names(&invalid(&Enc::new(VERSION).u32(n).done()), &["components; at most 64"]);
        }
        // Byte 21 is the first component's kind: version, count, start, end before it.
        const KIND_AT: usize = 1 + 4 + 8 + 8;
        let mut b = layout(vec![dom(M)]).encode();
        assert_eq!(b[KIND_AT], KIND_MDT);
        for kind in [0, 3, 0xff] {
            b[KIND_AT] = kind;
            assert_names(&invalid(&b), &["component 0", &format!("kind {kind} is unknown")]);
        }
        // After the kind: count (4), size (8), offset (4), then the two flags.
        const OVERSTRIPE_AT: usize = KIND_AT + 1 + 4 + 8 + 4;
        const POOL_FLAG_AT: usize = OVERSTRIPE_AT + 1;
        const POOL_LEN_AT: usize = POOL_FLAG_AT + 1;
        let two = layout(vec![stripes(0, M, 1, 0), stripes(M, EOF, 2, 0)]).encode();
        let mut b = two.clone();
        b[OVERSTRIPE_AT] = 2;
        assert_names(&invalid(&b), &["component 0", "overstripe flag is 2"]);
        let mut b = two.clone();
        b[POOL_FLAG_AT] = 7;
        assert_names(&invalid(&b), &["component 0", "pool flag is 7"]);
        // A long pool name is refused by its length, before its bytes are read.
        let long = Layout::plain(Striping { pool: Some("p".repeat(POOL_NAME_MAX + 1)), ..Striping::default() });
        assert_names(&invalid(&long.encode()), &["component 0", "pool name of 16 bytes is longer than 15"]);
        let mut b = Layout::plain(Striping { pool: Some("ab".into()), ..Striping::default() }).encode();
        b[POOL_LEN_AT..POOL_LEN_AT + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_names(&invalid(&b), &["pool name of 4294967295 bytes"]);
        let mut b = Layout::plain(Striping { pool: Some("ab".into()), ..Striping::default() }).encode();
        b[POOL_LEN_AT + 4] = 0xff;
        assert_names(&invalid(&b), &["component 0", "not UTF-8"]);
    }

    fn parse(args: &str) -> Layout {
        let args: Vec<&str> = args.split_whitespace().collect();
        match Layout::from_lfs_args(&args) {
            Ok(l) => l,
            Err(e) => panic!("{args:?}: {e}"),
        }
    }

    fn parse_error(args: &str) -> String {
        let args: Vec<&str> = args.split_whitespace().collect();
        match Layout::from_lfs_args(&args) {
            Ok(l) => panic!("{args:?} parsed as {l:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn lfs_setstripe_examples_parse() {
        assert_eq!(parse("-c 4 -S 4M"), Layout::plain(striping(4, 4 * M)));
        assert_eq!(
            parse("-E 1M -L mdt -E 64M -c 1 -E -1 -c -1"),
            layout(vec![dom(M), stripes(M, 64 * M, 1, 0), stripes(64 * M, EOF, -1, 0)])
        );
        assert_eq!(
            parse("-E 64K -L mdt -E eof -C 8"),
            layout(vec![
                dom(64 * K),
                Component {
                    start: 64 * K,
                    end: EOF,
                    kind: Kind::Stripes(Striping { count: 8, overstripe: true, ..Striping::default() })
                },
            ])
        );
        assert_eq!(
            parse("-c -1 -p flash"),
            Layout::plain(Striping { count: -1, pool: Some("flash".into()), ..Striping::default() })
        );
        // Long names, --name=value, suffixes in either case, plain bytes, -i, -L raid0.
        assert_eq!(
            parse("--stripe-count=2 --stripe-size 65536 --stripe-index 5 --pool=ssd --layout RAID0"),
            Layout::plain(Striping { count: 2, size: 64 * K, offset: 5, pool: Some("ssd".into()), overstripe: false })
        );
        assert_eq!(
            parse("--component-end 1g -S 1m -E 4G --overstripe-count 16 -S 256k -E EOF -c 32 -S 4M"),
            layout(vec![
                stripes(0, G, 0, M),
                Component {
                    start: G,
                    end: 4 * G,
                    kind: Kind::Stripes(Striping { count: 16, size: 256 * K, overstripe: true, ..Striping::default() }),
                },
                stripes(4 * G, EOF, 32, 4 * M),
            ])
        );
        // A DoM component may name its stripe size if it is its end, as Lustre prints it.
        assert_eq!(parse("-E 1M -L mdt -S 1M -E -1"), layout(vec![dom(M), stripes(M, EOF, 0, 0)]));
        assert_eq!(parse("-E 1M -L mdt"), layout(vec![dom(M)]));
        // No options: everything from the default.
        assert_eq!(parse(""), Layout::plain(Striping::default()));
    }

    #[test]
    fn bad_lfs_arguments_are_named() {
        let cases: &[(&str, &[&str])] = &[
            ("-c 4 -x 1", &["unknown option \"-x\""]),
            ("--stripe-cont 4", &["unknown option \"--stripe-cont\""]),
            ("-c=4", &["unknown option \"-c=4\""]),
            ("-c 4 file", &["unexpected argument \"file\""]),
            ("-c", &["option -c needs a value"]),
            ("-E 1M -L mdt -E", &["option -E needs a value"]),
            ("-c four", &["option -c", "\"four\" is not a 32-bit integer"]),
            ("-c 3000000000", &["\"3000000000\" is not a 32-bit integer"]),
            ("-i 1.5", &["option -i", "\"1.5\""]),
            ("-S 4Q", &["option -S", "\"4Q\" is not a size"]),
            ("-S M", &["\"M\" is not a size"]),
            ("-S +4M", &["\"+4M\" is not a size"]),
            ("-S -1", &["\"-1\" is not a size"]),
            ("-S 99999999999T", &["\"99999999999T\" is not a size"]),
            ("-E -2 -c 1", &["option -E", "\"-2\" is not a size"]),
            ("-L raid1", &["option -L", "\"raid1\" is not a layout"]),
            ("-c 1 -c 2", &["component 0", "-c sets what -c already set"]),
            ("-E 1M -c 1 -E -1 -c 2 -C 4", &["component 1", "-C sets what -c already set"]),
            ("-E -1 -S 1M --stripe-size 2M", &["component 0", "--stripe-size sets what -S already set"]),
            ("-c 4 -E -1", &["option -c comes before the first -E"]),
            ("-E 1M -L mdt -c 1 -E -1", &["component 0", "option -c does not apply to a Data-on-MDT"]),
            ("-E 1M -C 2 -L mdt -E -1", &["component 0", "option -C does not apply"]),
            ("-E 1M -L mdt -i 0 -E -1", &["option -i does not apply"]),
            ("-E 1M -L mdt -p flash -E -1", &["option -p does not apply"]),
            (
                "-E 1M -L mdt -S 64K -E -1",
                &["component 0", "stripe size 65536 of a Data-on-MDT component must be its end, 1048576"],
            ),
            // The result is validated.
            ("-S 100000", &["component 0", "stripe size 100000 is not a multiple of 64 KiB"]),
            ("-E 2T -c 1", &["component 0", "the last component must reach EOF"]),
            ("-E 1M -c 1 -E -1 -L mdt", &["component 1", "must be the first component"]),
            ("-L mdt", &["component 0", "Data-on-MDT component ends at EOF"]),
            ("-E 6M -S 4M -E -1", &["component 0", "end 6291456 is not a multiple of its stripe size 4194304"]),
            ("-C 0", &["overstriping needs a stripe count"]),
            ("-p way_too_long_pool", &["at most 15"]),
        ];
        for (args, parts) in cases {
            assert_names(&parse_error(args), parts);
        }
    }

    #[test]
    fn getstripe_display() {
        let want = "\
lcm_entry_count:   3
  lcme_id:             1
  lcme_extent.e_start: 0
  lcme_extent.e_end:   1048576
    lmm_stripe_count:  0
    lmm_stripe_size:   1048576
    lmm_pattern:       mdt

  lcme_id:             2
  lcme_extent.e_start: 1048576
  lcme_extent.e_end:   67108864
    lmm_stripe_count:  8
    lmm_stripe_size:   1048576
    lmm_pattern:       raid0,overstriped
    lmm_stripe_offset: 3

  lcme_id:             3
  lcme_extent.e_start: 67108864
  lcme_extent.e_end:   EOF
    lmm_stripe_count:  -1
    lmm_stripe_size:   4194304
    lmm_pattern:       raid0
    lmm_stripe_offset: -1
    lmm_pool:          flash
";
        assert_eq!(pfl().to_string(), want);
    }

    #[test]
    fn defaults_fill_only_what_is_unset() {
        let fs = Striping { count: 2, size: 4 * M, offset: 9, pool: Some("fs".into()), overstripe: false };
        let mut l = parse("-E 1M -L mdt -E 64M -c 1 -E -1 -S 8M -p flash");
        l.fill_defaults(&fs);
        let mut last = striping(2, 8 * M);
        last.pool = Some("flash".into());
        assert_eq!(
            l,
            layout(vec![
                dom(M),
                stripes(M, 64 * M, 1, 4 * M),
                Component { start: 64 * M, end: EOF, kind: Kind::Stripes(last) },
            ])
        );
        assert_eq!(l.validate(), Ok(()));
        // A new file takes its directory's default, else the file system's.
        assert_eq!(Layout::inherited(None, &Striping::fs_default()), Layout::plain(Striping::fs_default()));
        let dir = parse("-E 64M -S 1M -E -1 -c -1");
        assert_eq!(
            Layout::inherited(Some(&dir), &Striping::fs_default()),
            layout(vec![stripes(0, 64 * M, 1, M), stripes(64 * M, EOF, -1, M)])
        );
        // An inherited size that does not divide an end is caught by validating again.
        let mut l = parse("-E 1M -E -1");
        l.fill_defaults(&striping(1, 4 * M));
        assert_names(&error(&l), &["component 0", "not a multiple of its stripe size 4194304"]);
    }

    #[test]
    fn component_at_finds_the_covering_component() {
        let l = pfl();
        assert_eq!(l.component_at(0).map(|(i, _)| i), Some(0));
        assert_eq!(l.component_at(M - 1).map(|(i, _)| i), Some(0));
        assert_eq!(l.component_at(M).map(|(i, _)| i), Some(1));
        assert_eq!(l.component_at(64 * M - 1).map(|(i, _)| i), Some(1));
        assert_eq!(l.component_at(64 * M), Some((2, &l.components[2])));
        assert_eq!(l.component_at(u64::MAX).map(|(i, _)| i), Some(2));
        let only_dom = layout(vec![dom(M)]);
        assert_eq!(only_dom.component_at(M - 1).map(|(i, _)| i), Some(0));
        assert_eq!(only_dom.component_at(M), None);
    }

    #[test]
    fn striping_matches_a_model() {
        let mut rng = Rng::new(seed("striping_matches_a_model"));
        // Small components, every byte: the model deals the component out one stripe at a
        // time, round robin, appending each stripe to its object.
        for _ in 0..300 {
            let start = rng.below(1000);
            let size = 1 + rng.below(40);
            let count = 1 + rng.below(12) as u32;
            let len = 1 + rng.below(4000) as usize;
            let mut object_len = vec![0u64; count as usize];
            let mut model: Vec<(u32, u64)> = Vec::with_capacity(len + size as usize);
            for stripe in 0.. {
                if model.len() >= len {
                    break;
                }
                let object = stripe % count;
                let base = object_len[object as usize];
                model.extend((0..size).map(|b| (object, base + b)));
                object_len[object as usize] += size;
            }
            for (i, want) in model[..len].iter().enumerate() {
                let got = stripe_of(start, size, count, start + i as u64);
                assert_eq!(got, *want, "start {start} size {size} count {count} byte {i}");
            }
        }
        // Real sizes and far offsets: the answer maps back to the same file offset, the
        // object is in range, and the bytes within a stripe stay together.
        for _ in 0..10_000 {
            let start = rng.below(1 << 24) * STRIPE_SIZE_UNIT;
            let size = (1 + rng.below(STRIPE_SIZE_MAX / STRIPE_SIZE_UNIT)) * STRIPE_SIZE_UNIT;
            let count = 1 + rng.below(STRIPE_COUNT_MAX as u64) as u32;
            let offset = start + rng.below(1 << 60);
            let (object, at) = stripe_of(start, size, count, offset);
            assert!(object < count);
            let stripe = at / size * u64::from(count) + u64::from(object);
            assert_eq!(start + stripe * size + at % size, offset, "start {start} size {size} count {count}");
            assert_eq!(at % size, (offset - start) % size);
        }
    }

    #[test]
    #[should_panic(expected = "resolved stripe size and count")]
    fn stripe_of_refuses_an_unresolved_count() {
        stripe_of(0, M, 0, 0);
    }

    #[test]
    #[should_panic(expected = "before the component's start")]
    fn stripe_of_refuses_an_offset_before_the_component() {
        stripe_of(M, M, 1, 0);
    }
}

/// OST pools (Lustre's `lctl pool_new`/`pool_add`): named sets of OSTs that a layout's
/// `-p POOL` allocates from. The MGS stores each as the parameter `lov.pool.NAME`, whose
/// value lists OST indices (`0,2,4-7`); every MDT follows them.
pub mod pools {
    /// The parameter prefix of a pool.
    pub const PARAM_PREFIX: &str = "lov.pool.";
    /// OSTs one pool lists at most.
    pub const OSTS_MAX: usize = 65_536;

    /// Check a pool name: 1 to [`super::POOL_NAME_MAX`] letters, digits, `_`, `.`, `-`.
    pub fn check_name(name: &str) -> Result<(), String> {
        if name.is_empty() || name.len() > super::POOL_NAME_MAX {
            return Err(format!("pool name {name:?}: 1 to {} bytes", super::POOL_NAME_MAX));
        }
        if let Some(ch) = name.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))) {
            return Err(format!("pool name {name:?} has the character {ch:?}; only letters, digits, '_', '.' and '-'"));
        }
        Ok(())
    }

    /// Parse an OST list: indices and ranges separated by commas (`0,2,4-7`), sorted and
    /// without repeats in the result.
    pub fn parse_osts(s: &str) -> Result<Vec<u32>, String> {
        let mut out = std::collections::BTreeSet::new();
        for part in s.split(',').map(str::trim) {
            let num =
                |t: &str| t.trim().parse::<u32>().map_err(|_| format!("{t:?} in OST list {s:?} is not an OST index"));
            let (a, b) = match part.split_once('-') {
                Some((a, b)) => (num(a)?, num(b)?),
                None => (num(part)?, num(part)?),
            };
            if a > b {
                return Err(format!("range {part:?} in OST list {s:?} runs backwards"));
            }
            if (b - a) as usize >= OSTS_MAX || out.len() + (b - a) as usize >= OSTS_MAX {
                return Err(format!("OST list {s:?} names more than {OSTS_MAX} OSTs"));
            }
            out.extend(a..=b);
        }
        Ok(out.into_iter().collect())
    }

    /// The pools among `params` (name, value): name → OSTs. Malformed ones are left out
    /// (the MGS refuses them when they are set).
    pub fn from_params<'a>(
        params: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> std::collections::BTreeMap<String, Vec<u32>> {
        params
            .into_iter()
            .filter_map(|(n, v)| {
                let name = n.strip_prefix(PARAM_PREFIX)?;
                check_name(name).ok()?;
                Some((name.to_string(), parse_osts(v).ok()?))
            })
            .collect()
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn ost_lists_and_names() {
            assert_eq!(parse_osts("0,2,4-7, 3").unwrap(), vec![0, 2, 3, 4, 5, 6, 7]);
            assert!(parse_osts("x").unwrap_err().contains("not an OST index"));
            assert!(parse_osts("5-2").unwrap_err().contains("backwards"));
            assert!(parse_osts("0-4000000000").unwrap_err().contains("more than"));
            assert!(check_name("fast_1").is_ok());
            assert!(check_name("a/b").unwrap_err().contains("'/'"));
            assert!(check_name("sixteen-bytes-xx").unwrap_err().contains("1 to 15"));
            let p = from_params([("lov.pool.fast", "0-1"), ("osc.*.checksums", "0"), ("lov.pool.bad", "?")]);
            assert_eq!(p.into_iter().collect::<Vec<_>>(), vec![("fast".to_string(), vec![0, 1])]);
        }
    }
}
