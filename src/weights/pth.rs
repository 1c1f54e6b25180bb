//! Reading torch checkpoints (`pytorch_model.bin`, `*.pt`) without trusting them:
//! [`PthCheckpoint`], a zip reader and an unpickler of this crate's own (instead of candle's
//! `candle::pickle`, which recurses without limit, copies memo values and keeps any global).
//! How it defends itself is documented on [`PthCheckpoint`].

use candle::{DType, Device, Tensor};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{Read, Seek, SeekFrom};
use std::ops::Range;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// Deepest nesting accepted: open `MARK`s, and containers inside containers.
const MAX_DEPTH: usize = 256;
/// Most dimensions a tensor may have (torch's own limit is 64 as well).
const MAX_RANK: usize = 64;
/// Largest `data.pkl` accepted: a state dict of 100,000 tensors pickles to about 10 MB.
const MAX_PICKLE_BYTES: usize = 128 << 20;
/// Longest line of a text opcode (`GLOBAL` module and name, `INT`, `LONG`).
const MAX_LINE: usize = 256;
/// Longest storage key (torch's are decimal numbers).
const MAX_KEY: usize = 64;

/// Every global the pickle may name, as `module.name`. They are what `torch.save` writes for
/// state dicts of dense tensors (torch 2.15, protocols 1 to 5, checked with `pickletools`;
/// see `tests/fixtures/pth/make_pth_fixtures.py`): the dict class, the tensor and parameter
/// rebuild functions, the typed storage classes (`torch.FloatStorage`, ...), the untyped
/// storage and dtype names that `_rebuild_tensor_v3` takes for the newer dtypes, and
/// `torch.Tensor`/`torch.nn.parameter.Parameter` as the type argument of
/// `_rebuild_from_type_v2` (a tensor saved with Python attributes).
const ALLOWED_GLOBALS: &str = "collections.OrderedDict, torch._utils._rebuild_tensor_v2, \
    torch._utils._rebuild_tensor_v3, torch._utils._rebuild_parameter, \
    torch._utils._rebuild_parameter_with_state, torch._tensor._rebuild_from_type_v2, \
    torch.Tensor, torch.nn.parameter.Parameter, torch.<X>Storage, \
    torch.storage.UntypedStorage, torch.<dtype>";

// ---------------------------------------------------------------------------------------------
// dtypes

/// One torch dtype: its names, element size and what candle makes of it.
struct DtypeDesc {
    /// `torch.<name>` (`float32`).
    name: &'static str,
    /// The legacy typed storage class (`FloatStorage`), for the ones that have one.
    storage: Option<&'static str>,
    /// Bytes per element.
    size: usize,
    /// The candle dtype it loads as (`None`: candle cannot represent it).
    candle: Option<DType>,
}

const fn desc(
    name: &'static str,
    storage: Option<&'static str>,
    size: usize,
    candle: Option<DType>,
) -> DtypeDesc {
    DtypeDesc {
        name,
        storage,
        size,
        candle,
    }
}

const DTYPES: &[DtypeDesc] = &[
    desc("float32", Some("FloatStorage"), 4, Some(DType::F32)),
    desc("float64", Some("DoubleStorage"), 8, Some(DType::F64)),
    desc("float16", Some("HalfStorage"), 2, Some(DType::F16)),
    desc("bfloat16", Some("BFloat16Storage"), 2, Some(DType::BF16)),
    desc("uint8", Some("ByteStorage"), 1, Some(DType::U8)),
    desc("int8", Some("CharStorage"), 1, None),
    desc("int16", Some("ShortStorage"), 2, Some(DType::I16)),
    desc("int32", Some("IntStorage"), 4, Some(DType::I32)),
    desc("int64", Some("LongStorage"), 8, Some(DType::I64)),
    // Loaded as U8 holding 0 or 1, as `TensorFile` loads safetensors BOOL.
    desc("bool", Some("BoolStorage"), 1, Some(DType::U8)),
    desc("complex64", Some("ComplexFloatStorage"), 8, None),
    desc("complex128", Some("ComplexDoubleStorage"), 16, None),
    desc("complex32", None, 4, None),
    desc("uint16", None, 2, None),
    desc("uint32", None, 4, Some(DType::U32)),
    desc("uint64", None, 8, None),
    desc("float8_e4m3fn", None, 1, Some(DType::F8E4M3)),
    desc("float8_e5m2", None, 1, None),
    desc("float8_e4m3fnuz", None, 1, None),
    desc("float8_e5m2fnuz", None, 1, None),
    desc("float8_e8m0fnu", None, 1, None),
];

/// A torch dtype, as an index into [`DTYPES`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct TorchDtype(u8);

impl TorchDtype {
    fn desc(self) -> &'static DtypeDesc {
        &DTYPES[self.0 as usize]
    }

    fn by(f: impl Fn(&DtypeDesc) -> bool) -> Option<Self> {
        DTYPES.iter().position(f).map(|i| Self(i as u8))
    }

    /// What candle loads it as, or the error naming the tensor.
    fn candle(self) -> Result<DType, String> {
        self.desc().candle.ok_or_else(|| {
            let supported: Vec<&str> = DTYPES
                .iter()
                .filter(|d| d.candle.is_some())
                .map(|d| d.name)
                .collect();
            format!(
                "has dtype torch.{}, which candle cannot represent (supported: {})",
                self.desc().name,
                supported.join(", ")
            )
        })
    }
}

// ---------------------------------------------------------------------------------------------
// The allow-list

/// The globals this reader understands; nothing else is ever accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Global {
    OrderedDict,
    RebuildTensorV2,
    RebuildTensorV3,
    RebuildParameter,
    RebuildParameterWithState,
    RebuildFromTypeV2,
    /// `torch.Tensor` or `torch.nn.parameter.Parameter` (only as a type argument).
    TensorType,
    /// `torch.<X>Storage`.
    TypedStorage(TorchDtype),
    /// `torch.storage.UntypedStorage` (its size is in bytes; the dtype comes separately).
    UntypedStorage,
    /// `torch.<dtype>`.
    Dtype(TorchDtype),
}

impl Global {
    fn lookup(module: &str, name: &str) -> Option<Self> {
        Some(match (module, name) {
            ("collections", "OrderedDict") => Self::OrderedDict,
            ("torch._utils", "_rebuild_tensor_v2") => Self::RebuildTensorV2,
            ("torch._utils", "_rebuild_tensor_v3") => Self::RebuildTensorV3,
            ("torch._utils", "_rebuild_parameter") => Self::RebuildParameter,
            ("torch._utils", "_rebuild_parameter_with_state") => Self::RebuildParameterWithState,
            ("torch._tensor", "_rebuild_from_type_v2") => Self::RebuildFromTypeV2,
            ("torch", "Tensor") | ("torch._tensor", "Tensor") => Self::TensorType,
            ("torch.nn.parameter", "Parameter") => Self::TensorType,
            ("torch.storage", "UntypedStorage") => Self::UntypedStorage,
            ("torch", n) => {
                if let Some(d) = TorchDtype::by(|d| d.storage == Some(n)) {
                    Self::TypedStorage(d)
                } else {
                    Self::Dtype(TorchDtype::by(|d| d.name == n)?)
                }
            }
            _ => return None,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// The unpickler

/// Index of an object in the arena.
type Id = u32;

/// One unpickled object. Containers hold indices, so nothing here is recursive.
#[derive(Debug)]
enum Val {
    None,
    Bool(bool),
    Int(i64),
    /// An integer beyond i64 (only its existence is kept).
    BigInt,
    Float,
    Str(Box<str>),
    /// bytes / bytearray (only their length matters to nobody; the content is not kept).
    Bytes,
    Tuple(Box<[Id]>),
    List(Vec<Id>),
    Dict(Vec<(Id, Id)>),
    Set(Vec<Id>),
    Global(Global),
    /// A persistent id `("storage", type, key, location, numel)`.
    Storage(StorageRef),
    /// The arguments of `_rebuild_tensor_v2`/`_v3`, checked for types only; the values are
    /// validated when the tensor gets its name.
    Tensor(Box<RawTensor>),
}

#[derive(Debug)]
struct StorageRef {
    /// `None` for `UntypedStorage` (then `numel` counts bytes).
    dtype: Option<TorchDtype>,
    key: Box<str>,
    numel: i64,
}

#[derive(Debug)]
struct RawTensor {
    /// The storage object (a [`Val::Storage`]).
    storage: Id,
    /// The dtype argument of `_rebuild_tensor_v3`.
    dtype: Option<TorchDtype>,
    offset: i64,
    /// The size and stride tuples (of ints, at most [`MAX_RANK`]: checked when rebuilt; kept
    /// as indices, so that a tensor rebuilt many times from memoised arguments copies nothing).
    size: Id,
    stride: Id,
    /// Whether the tensor metadata sets a lazy conjugate/negative bit.
    lazy_bits: bool,
}

struct Node {
    val: Val,
    /// Containers: 1 + the deepest child; everything else 0.
    depth: u32,
}

/// The stack machine. `stack` holds indices into `nodes`; `marks` the stack lengths at each
/// open `MARK` (CPython's metastack), so items below the innermost mark cannot be popped.
struct Unpickler<'a> {
    data: &'a [u8],
    pos: usize,
    nodes: Vec<Node>,
    stack: Vec<Id>,
    marks: Vec<usize>,
    memo: HashMap<u32, Id>,
    /// Container slots filled so far (bounded by the pickle's size).
    slots: usize,
    /// The interned `None` (hooks, metadata and the like are mostly `None`).
    none: Option<Id>,
}

/// An unpickling error: what and where (offset of the opcode).
type PResult<T> = Result<T, String>;

fn opcode_name(op: u8) -> &'static str {
    match op {
        b'(' => "MARK",
        b'.' => "STOP",
        b'0' => "POP",
        b'1' => "POP_MARK",
        b'2' => "DUP",
        b'F' => "FLOAT",
        b'I' => "INT",
        b'J' => "BININT",
        b'K' => "BININT1",
        b'L' => "LONG",
        b'M' => "BININT2",
        b'N' => "NONE",
        b'P' => "PERSID",
        b'Q' => "BINPERSID",
        b'R' => "REDUCE",
        b'S' => "STRING",
        b'T' => "BINSTRING",
        b'U' => "SHORT_BINSTRING",
        b'V' => "UNICODE",
        b'X' => "BINUNICODE",
        b'a' => "APPEND",
        b'b' => "BUILD",
        b'c' => "GLOBAL",
        b'd' => "DICT",
        b'}' => "EMPTY_DICT",
        b'e' => "APPENDS",
        b'g' => "GET",
        b'h' => "BINGET",
        b'i' => "INST",
        b'j' => "LONG_BINGET",
        b'l' => "LIST",
        b']' => "EMPTY_LIST",
        b'o' => "OBJ",
        b'p' => "PUT",
        b'q' => "BINPUT",
        b'r' => "LONG_BINPUT",
        b's' => "SETITEM",
        b't' => "TUPLE",
        b')' => "EMPTY_TUPLE",
        b'u' => "SETITEMS",
        b'G' => "BINFLOAT",
        0x80 => "PROTO",
        0x81 => "NEWOBJ",
        0x82 => "EXT1",
        0x83 => "EXT2",
        0x84 => "EXT4",
        0x85 => "TUPLE1",
        0x86 => "TUPLE2",
        0x87 => "TUPLE3",
        0x88 => "NEWTRUE",
        0x89 => "NEWFALSE",
        0x8a => "LONG1",
        0x8b => "LONG4",
        b'B' => "BINBYTES",
        b'C' => "SHORT_BINBYTES",
        0x8c => "SHORT_BINUNICODE",
        0x8d => "BINUNICODE8",
        0x8e => "BINBYTES8",
        0x8f => "EMPTY_SET",
        0x90 => "ADDITEMS",
        0x91 => "FROZENSET",
        0x92 => "NEWOBJ_EX",
        0x93 => "STACK_GLOBAL",
        0x94 => "MEMOIZE",
        0x95 => "FRAME",
        0x96 => "BYTEARRAY8",
        0x97 => "NEXT_BUFFER",
        0x98 => "READONLY_BUFFER",
        _ => "unknown",
    }
}

impl<'a> Unpickler<'a> {
    fn new(data: &'a [u8]) -> Self {
        Self {
            data,
            pos: 0,
            nodes: Vec::new(),
            stack: Vec::new(),
            marks: Vec::new(),
            memo: HashMap::new(),
            slots: 0,
            none: None,
        }
    }

    // -- reading the stream; every length is checked against what remains ----------------

    fn take(&mut self, n: usize) -> PResult<&'a [u8]> {
        let remaining = self.data.len() - self.pos;
        if n > remaining {
            return Err(format!(
                "truncated: needs {n} more bytes at offset {}, {remaining} remain",
                self.pos
            ));
        }
        let s = &self.data[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn u8(&mut self) -> PResult<u8> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> PResult<u16> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> PResult<u32> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self) -> PResult<u64> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    /// A length prefix, checked against the bytes that remain before anything is allocated.
    fn len_checked(&self, n: u64) -> PResult<usize> {
        let remaining = self.data.len() - self.pos;
        match usize::try_from(n) {
            Ok(n) if n <= remaining => Ok(n),
            _ => Err(format!(
                "length {n} at offset {} is longer than the {remaining} bytes that remain",
                self.pos
            )),
        }
    }

    /// A text line (without `\n`) of at most [`MAX_LINE`] bytes.
    fn line(&mut self) -> PResult<&'a [u8]> {
        let rest = &self.data[self.pos..];
        let limit = rest.len().min(MAX_LINE + 1);
        match rest[..limit].iter().position(|&b| b == b'\n') {
            Some(n) => {
                let s = &rest[..n];
                self.pos += n + 1;
                Ok(s)
            }
            None if limit > MAX_LINE => Err(format!(
                "text argument at offset {} longer than {MAX_LINE} bytes",
                self.pos
            )),
            None => Err(format!("truncated text argument at offset {}", self.pos)),
        }
    }

    fn utf8(bytes: &[u8], at: usize) -> PResult<Box<str>> {
        std::str::from_utf8(bytes)
            .map(Box::from)
            .map_err(|_| format!("string at offset {at} is not valid UTF-8"))
    }

    // -- objects, budgets and the stack -----------------------------------------------

    fn alloc(&mut self, val: Val, depth: u32) -> PResult<Id> {
        // Each opcode builds at most one object, so this never exceeds the pickle size; the
        // check makes the bound explicit rather than a consequence.
        if self.nodes.len() > self.data.len() + 16 {
            return Err(format!(
                "builds more objects than the pickle has bytes ({})",
                self.data.len()
            ));
        }
        if depth as usize > MAX_DEPTH {
            return Err(format!(
                "nesting deeper than {MAX_DEPTH} at offset {}",
                self.pos
            ));
        }
        let id = self.nodes.len() as Id;
        self.nodes.push(Node { val, depth });
        Ok(id)
    }

    fn push_new(&mut self, val: Val) -> PResult<()> {
        let id = self.alloc(val, 0)?;
        self.stack.push(id);
        Ok(())
    }

    /// An empty container (depth 1, like any container).
    fn push_empty(&mut self, val: Val) -> PResult<()> {
        let id = self.alloc(val, 1)?;
        self.stack.push(id);
        Ok(())
    }

    fn push_none(&mut self) -> PResult<()> {
        let id = match self.none {
            Some(id) => id,
            None => {
                let id = self.alloc(Val::None, 0)?;
                self.none = Some(id);
                id
            }
        };
        self.stack.push(id);
        Ok(())
    }

    /// Fills `n` container slots: bounded by twice the pickle's size (every slot's object
    /// was pushed by an opcode of at least one byte; dict slots count two).
    fn fill(&mut self, n: usize) -> PResult<()> {
        self.slots += n;
        if self.slots > 2 * self.data.len() + 16 {
            return Err(format!(
                "fills more container slots than the pickle has bytes ({})",
                self.data.len()
            ));
        }
        Ok(())
    }

    fn depth_of(&self, ids: impl Iterator<Item = Id>) -> u32 {
        ids.map(|i| self.nodes[i as usize].depth)
            .max()
            .map_or(1, |d| d.saturating_add(1))
    }

    fn base(&self) -> usize {
        self.marks.last().copied().unwrap_or(0)
    }

    fn pop(&mut self) -> PResult<Id> {
        if self.stack.len() <= self.base() {
            return Err(format!("stack underflow at offset {}", self.pos));
        }
        Ok(self.stack.pop().expect("checked above"))
    }

    fn top(&self) -> PResult<Id> {
        if self.stack.len() <= self.base() {
            return Err(format!("stack underflow at offset {}", self.pos));
        }
        Ok(*self.stack.last().expect("checked above"))
    }

    fn pop_mark(&mut self) -> PResult<Vec<Id>> {
        let mark = self
            .marks
            .pop()
            .ok_or_else(|| format!("no MARK open at offset {}", self.pos))?;
        Ok(self.stack.split_off(mark))
    }

    fn val(&self, id: Id) -> &Val {
        &self.nodes[id as usize].val
    }

    fn kind(&self, id: Id) -> &'static str {
        match self.val(id) {
            Val::None => "None",
            Val::Bool(_) => "a bool",
            Val::Int(_) | Val::BigInt => "an int",
            Val::Float => "a float",
            Val::Str(_) => "a string",
            Val::Bytes => "bytes",
            Val::Tuple(_) => "a tuple",
            Val::List(_) => "a list",
            Val::Dict(_) => "a dict",
            Val::Set(_) => "a set",
            Val::Global(_) => "a global",
            Val::Storage(_) => "a storage",
            Val::Tensor(_) => "a tensor",
        }
    }

    fn container(&mut self, items: Vec<Id>, make: fn(Vec<Id>) -> Val) -> PResult<Id> {
        self.fill(items.len())?;
        let depth = self.depth_of(items.iter().copied());
        self.alloc(make(items), depth)
    }

    fn tuple(&mut self, items: Vec<Id>) -> PResult<()> {
        let id = self.container(items, |v| Val::Tuple(v.into_boxed_slice()))?;
        self.stack.push(id);
        Ok(())
    }

    /// Adds `items` to the list or set `target` (APPEND, APPENDS, ADDITEMS).
    fn extend(&mut self, target: Id, items: Vec<Id>, at: usize) -> PResult<()> {
        self.fill(items.len())?;
        let depth = self
            .depth_of(items.iter().copied())
            .max(self.nodes[target as usize].depth);
        if depth as usize > MAX_DEPTH {
            return Err(format!("nesting deeper than {MAX_DEPTH} at offset {at}"));
        }
        let kind = self.kind(target);
        let node = &mut self.nodes[target as usize];
        match &mut node.val {
            Val::List(v) | Val::Set(v) => v.extend(items),
            _ => return Err(format!("APPEND to {kind} at offset {at}")),
        }
        node.depth = depth;
        Ok(())
    }

    /// Adds key/value pairs to the dict `target` (SETITEM, SETITEMS).
    fn set_items(&mut self, target: Id, items: Vec<Id>, at: usize) -> PResult<()> {
        if !items.len().is_multiple_of(2) {
            return Err(format!(
                "SETITEMS with an odd number of items at offset {at}"
            ));
        }
        self.fill(items.len())?;
        let depth = self
            .depth_of(items.iter().copied())
            .max(self.nodes[target as usize].depth);
        if depth as usize > MAX_DEPTH {
            return Err(format!("nesting deeper than {MAX_DEPTH} at offset {at}"));
        }
        let kind = self.kind(target);
        let node = &mut self.nodes[target as usize];
        match &mut node.val {
            Val::Dict(d) => d.extend(items.chunks_exact(2).map(|kv| (kv[0], kv[1]))),
            _ => return Err(format!("SETITEM on {kind} at offset {at}")),
        }
        node.depth = depth;
        Ok(())
    }

    fn memo_get(&mut self, key: u32, at: usize) -> PResult<()> {
        let id = *self
            .memo
            .get(&key)
            .ok_or_else(|| format!("memo entry {key} read before it is written (offset {at})"))?;
        self.stack.push(id);
        Ok(())
    }

    fn memo_put(&mut self, key: u32) -> PResult<()> {
        let id = self.top()?;
        self.memo.insert(key, id);
        Ok(())
    }

    fn global(&mut self, module: &str, name: &str, at: usize) -> PResult<()> {
        match Global::lookup(module, name) {
            Some(g) => self.push_new(Val::Global(g)),
            None => Err(refused(module, name, at)),
        }
    }

    // -- interpreting the allowed globals -----------------------------------------------

    fn int_arg(&self, id: Id, what: &str, at: usize) -> PResult<i64> {
        match self.val(id) {
            Val::Int(i) => Ok(*i),
            Val::Bool(b) => Ok(i64::from(*b)),
            Val::BigInt => Err(format!(
                "{what} at offset {at} is an integer beyond 64 bits"
            )),
            _ => Err(format!(
                "{what} at offset {at} is {}, not an int",
                self.kind(id)
            )),
        }
    }

    /// Checks that `id` is a tuple of at most [`MAX_RANK`] ints; returns its length.
    fn ints_arg(&self, id: Id, what: &str, at: usize) -> PResult<usize> {
        let Val::Tuple(items) = self.val(id) else {
            return Err(format!(
                "{what} at offset {at} is {}, not a tuple",
                self.kind(id)
            ));
        };
        if items.len() > MAX_RANK {
            return Err(format!(
                "{what} at offset {at} has {} dimensions (at most {MAX_RANK})",
                items.len()
            ));
        }
        for &i in items.iter() {
            self.int_arg(i, what, at)?;
        }
        Ok(items.len())
    }

    /// The ints of a tuple checked by [`Unpickler::ints_arg`] (tuples never change).
    fn ints(&self, id: Id) -> Vec<i64> {
        let Val::Tuple(items) = self.val(id) else {
            unreachable!("checked by ints_arg")
        };
        items
            .iter()
            .map(|&i| match self.val(i) {
                Val::Int(v) => *v,
                Val::Bool(b) => i64::from(*b),
                _ => unreachable!("checked by ints_arg"),
            })
            .collect()
    }

    /// A tuple of call arguments: at most 8 (what the allowed callables take), checked before
    /// anything iterates or copies it.
    fn tuple_arg(&self, id: Id, what: &str, at: usize) -> PResult<&[Id]> {
        match self.val(id) {
            Val::Tuple(t) if t.len() > 8 => Err(format!(
                "{what} at offset {at} are a tuple of {} items (no allowed callable takes more \
                 than 8)",
                t.len()
            )),
            Val::Tuple(t) => Ok(t),
            _ => Err(format!(
                "{what} at offset {at} is {}, not a tuple",
                self.kind(id)
            )),
        }
    }

    /// `_rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks[, metadata])`
    /// and `_v3(..., hooks, dtype[, metadata])`.
    fn rebuild_tensor(&self, args: &[Id], v3: bool, at: usize) -> PResult<Val> {
        let what = if v3 {
            "_rebuild_tensor_v3"
        } else {
            "_rebuild_tensor_v2"
        };
        let (min, max) = if v3 { (7, 8) } else { (6, 7) };
        if args.len() < min || args.len() > max {
            return Err(format!(
                "{what} at offset {at} takes {min} or {max} arguments, got {}",
                args.len()
            ));
        }
        let storage = args[0];
        let Val::Storage(s) = self.val(storage) else {
            return Err(format!(
                "{what} at offset {at}: the storage argument is {}",
                self.kind(storage)
            ));
        };
        let dtype = if v3 {
            match self.val(args[6]) {
                Val::Global(Global::Dtype(d)) | Val::Global(Global::TypedStorage(d)) => Some(*d),
                _ => {
                    return Err(format!(
                        "{what} at offset {at}: the dtype argument is {}",
                        self.kind(args[6])
                    ))
                }
            }
        } else {
            None
        };
        if v3 != s.dtype.is_none() {
            return Err(format!(
                "{what} at offset {at} with a {} storage",
                if s.dtype.is_none() {
                    "untyped"
                } else {
                    "typed"
                }
            ));
        }
        let offset = self.int_arg(args[1], "the storage offset", at)?;
        let (size, stride) = (args[2], args[3]);
        let rank = self.ints_arg(size, "the size", at)?;
        let strides = self.ints_arg(stride, "the stride", at)?;
        if rank != strides {
            return Err(format!(
                "{what} at offset {at}: size and stride differ in length ({rank} and {strides})"
            ));
        }
        let lazy_bits = match args.get(max - 1).map(|&m| self.val(m)) {
            None | Some(Val::None) => false,
            Some(Val::Dict(d)) if d.len() > 4 => {
                return Err(format!(
                    "{what} at offset {at}: tensor metadata of {} entries (torch writes at most \
                     'conj' and 'neg')",
                    d.len()
                ))
            }
            Some(Val::Dict(d)) => d
                .iter()
                .any(|&(_, v)| !matches!(self.val(v), Val::Bool(false) | Val::Int(0))),
            Some(_) => {
                return Err(format!(
                    "{what} at offset {at}: the metadata argument is {}",
                    self.kind(args[max - 1])
                ))
            }
        };
        Ok(Val::Tensor(Box::new(RawTensor {
            storage,
            dtype,
            offset,
            size,
            stride,
            lazy_bits,
        })))
    }

    /// REDUCE / NEWOBJ: `callable(*args)` for the callables of the allow-list. Returns the
    /// new object, or an existing one (a parameter is its tensor).
    fn call(&mut self, callable: Id, args: Id, at: usize) -> PResult<Id> {
        let Val::Global(g) = *self.val(callable) else {
            return Err(format!(
                "REDUCE at offset {at} calls {}, not a global",
                self.kind(callable)
            ));
        };
        let args_v = self.tuple_arg(args, "the arguments", at)?.to_vec();
        let tensor_arg = |this: &Self, id: Id| -> PResult<Id> {
            match this.val(id) {
                Val::Tensor(_) => Ok(id),
                _ => Err(format!(
                    "a parameter at offset {at} wraps {}, not a tensor",
                    this.kind(id)
                )),
            }
        };
        match g {
            Global::OrderedDict => {
                if !args_v.is_empty() {
                    return Err(format!(
                        "OrderedDict at offset {at} called with arguments (torch passes none)"
                    ));
                }
                self.alloc(Val::Dict(Vec::new()), 1)
            }
            Global::RebuildTensorV2 | Global::RebuildTensorV3 => {
                let t = self.rebuild_tensor(&args_v, g == Global::RebuildTensorV3, at)?;
                self.alloc(t, 1)
            }
            Global::RebuildParameter | Global::RebuildParameterWithState => {
                let n = if g == Global::RebuildParameter { 3 } else { 4 };
                if args_v.len() != n {
                    return Err(format!(
                        "a parameter rebuild at offset {at} takes {n} arguments, got {}",
                        args_v.len()
                    ));
                }
                tensor_arg(self, args_v[0])
            }
            Global::RebuildFromTypeV2 => {
                // (func, type, args, state): a tensor with Python attributes (ignored).
                if args_v.len() != 4 {
                    return Err(format!(
                        "_rebuild_from_type_v2 at offset {at} takes 4 arguments, got {}",
                        args_v.len()
                    ));
                }
                if !matches!(self.val(args_v[1]), Val::Global(Global::TensorType)) {
                    return Err(format!(
                        "_rebuild_from_type_v2 at offset {at} rebuilds {}, not torch.Tensor",
                        self.kind(args_v[1])
                    ));
                }
                match self.val(args_v[0]) {
                    Val::Global(
                        f @ (Global::RebuildTensorV2
                        | Global::RebuildTensorV3
                        | Global::RebuildParameter
                        | Global::RebuildParameterWithState),
                    ) => {
                        let f = *f;
                        let inner = args_v[2];
                        if matches!(f, Global::RebuildTensorV2 | Global::RebuildTensorV3) {
                            let inner_args = self.tuple_arg(inner, "the arguments", at)?.to_vec();
                            let t =
                                self.rebuild_tensor(&inner_args, f == Global::RebuildTensorV3, at)?;
                            self.alloc(t, 1)
                        } else {
                            let inner_args = self.tuple_arg(inner, "the arguments", at)?;
                            match inner_args.first() {
                                Some(&t) => tensor_arg(self, t),
                                None => Err(format!("empty parameter rebuild at offset {at}")),
                            }
                        }
                    }
                    _ => Err(format!(
                        "_rebuild_from_type_v2 at offset {at} calls {}, not a tensor rebuild \
                         function",
                        self.kind(args_v[0])
                    )),
                }
            }
            Global::TensorType
            | Global::TypedStorage(_)
            | Global::UntypedStorage
            | Global::Dtype(_) => Err(format!(
                "REDUCE at offset {at} calls a type ({g:?}), which torch state dicts never do"
            )),
        }
    }

    /// BINPERSID: `("storage", storage_type, key, location, numel)`.
    fn persistent_load(&mut self, pid: Id, at: usize) -> PResult<()> {
        let t = self.tuple_arg(pid, "the persistent id", at)?;
        let bad = || {
            format!(
                "persistent id at offset {at} is not (\"storage\", storage type, key, location, \
             numel)"
            )
        };
        if t.len() != 5 || !matches!(self.val(t[0]), Val::Str(s) if &**s == "storage") {
            return Err(bad());
        }
        let dtype = match self.val(t[1]) {
            Val::Global(Global::TypedStorage(d)) => Some(*d),
            Val::Global(Global::UntypedStorage) => None,
            _ => return Err(bad()),
        };
        let Val::Str(key) = self.val(t[2]) else {
            return Err(bad());
        };
        if !matches!(self.val(t[3]), Val::Str(_)) {
            return Err(bad());
        }
        // torch's keys are decimal numbers; a key names a zip entry, so it must be a plain
        // name, and short (it is copied into every tensor that views the storage).
        if key.is_empty()
            || key.len() > MAX_KEY
            || !key
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            return Err(format!(
                "the storage key '{}' at offset {at} is not a plain name of at most {MAX_KEY} \
                 letters, digits, '_' or '-'",
                key.chars().take(80).collect::<String>().escape_debug()
            ));
        }
        let key = key.clone();
        let numel = self.int_arg(t[4], "the storage size", at)?;
        self.push_new(Val::Storage(StorageRef { dtype, key, numel }))
    }

    /// Runs the pickle to its STOP; returns the root object.
    fn run(&mut self) -> PResult<Id> {
        loop {
            let at = self.pos;
            let op = self
                .u8()
                .map_err(|_| "truncated: ends before STOP".to_string())?;
            match op {
                0x80 => {
                    let v = self.u8()?;
                    if v > 5 {
                        return Err(format!("pickle protocol {v} (at most 5 is known)"));
                    }
                }
                0x95 => {
                    // FRAME: framing is transparent; only check its length.
                    let n = self.u64()?;
                    self.len_checked(n)?;
                }
                b'.' => {
                    if !self.marks.is_empty() {
                        return Err(format!("STOP at offset {at} with a MARK still open"));
                    }
                    let root = self.pop()?;
                    if !self.stack.is_empty() {
                        return Err(format!(
                            "STOP at offset {at} leaves {} objects on the stack",
                            self.stack.len()
                        ));
                    }
                    return Ok(root);
                }
                b'(' => {
                    if self.marks.len() >= MAX_DEPTH {
                        return Err(format!("nesting deeper than {MAX_DEPTH} at offset {at}"));
                    }
                    self.marks.push(self.stack.len());
                }
                b'0' => {
                    if self.stack.len() > self.base() {
                        self.stack.pop();
                    } else if self.marks.pop().is_none() {
                        return Err(format!("POP on an empty stack at offset {at}"));
                    }
                }
                b'1' => {
                    self.pop_mark()?;
                }
                b'2' => {
                    let id = self.top()?;
                    self.stack.push(id);
                }
                b'N' => self.push_none()?,
                0x88 => self.push_new(Val::Bool(true))?,
                0x89 => self.push_new(Val::Bool(false))?,
                b'J' => {
                    let v = self.u32()? as i32;
                    self.push_new(Val::Int(v.into()))?
                }
                b'K' => {
                    let v = self.u8()?;
                    self.push_new(Val::Int(v.into()))?
                }
                b'M' => {
                    let v = self.u16()?;
                    self.push_new(Val::Int(v.into()))?
                }
                0x8a | 0x8b => {
                    let n = if op == 0x8a {
                        u64::from(self.u8()?)
                    } else {
                        u64::from(self.u32()?)
                    };
                    let n = self.len_checked(n)?;
                    let bytes = self.take(n)?;
                    self.push_new(little_endian_int(bytes))?
                }
                b'I' | b'L' => {
                    // Text integers: protocol 1 writes booleans as INT "00"/"01".
                    let line = self.line()?;
                    let v = text_int(line, op == b'L')
                        .ok_or_else(|| format!("malformed {} at offset {at}", opcode_name(op)))?;
                    self.push_new(v)?
                }
                b'G' => {
                    self.take(8)?;
                    self.push_new(Val::Float)?
                }
                b'X' | 0x8c | 0x8d | b'T' | b'U' => {
                    let n = match op {
                        b'X' | b'T' => u64::from(self.u32()?),
                        0x8d => self.u64()?,
                        _ => u64::from(self.u8()?),
                    };
                    let n = self.len_checked(n)?;
                    let bytes = self.take(n)?;
                    let s = match (op, Self::utf8(bytes, at)) {
                        (_, Ok(s)) => Val::Str(s),
                        // Python 2 byte strings need not be UTF-8.
                        (b'T' | b'U', Err(_)) => Val::Bytes,
                        (_, Err(e)) => return Err(e),
                    };
                    self.push_new(s)?
                }
                b'B' | b'C' | 0x8e | 0x96 => {
                    let n = match op {
                        b'B' => u64::from(self.u32()?),
                        b'C' => u64::from(self.u8()?),
                        _ => self.u64()?,
                    };
                    let n = self.len_checked(n)?;
                    self.take(n)?;
                    self.push_new(Val::Bytes)?
                }
                b')' => self.tuple(Vec::new())?,
                0x85..=0x87 => {
                    let n = (op - 0x84) as usize;
                    let mut items = vec![0; n];
                    for slot in items.iter_mut().rev() {
                        *slot = self.pop()?;
                    }
                    self.tuple(items)?
                }
                b't' => {
                    let items = self.pop_mark()?;
                    self.tuple(items)?
                }
                b']' => self.push_empty(Val::List(Vec::new()))?,
                b'l' => {
                    let items = self.pop_mark()?;
                    let id = self.container(items, Val::List)?;
                    self.stack.push(id)
                }
                b'}' => self.push_empty(Val::Dict(Vec::new()))?,
                b'd' => {
                    let items = self.pop_mark()?;
                    let id = self.alloc(Val::Dict(Vec::new()), 1)?;
                    self.set_items(id, items, at)?;
                    self.stack.push(id)
                }
                0x8f => self.push_empty(Val::Set(Vec::new()))?,
                0x91 => {
                    let items = self.pop_mark()?;
                    let id = self.container(items, Val::Set)?;
                    self.stack.push(id)
                }
                b'a' => {
                    let v = self.pop()?;
                    let target = self.top()?;
                    self.extend(target, vec![v], at)?
                }
                b'e' | 0x90 => {
                    let items = self.pop_mark()?;
                    let target = self.top()?;
                    let is_set = matches!(self.val(target), Val::Set(_));
                    if (op == 0x90) != is_set {
                        return Err(format!(
                            "{} on {} at offset {at}",
                            opcode_name(op),
                            self.kind(target)
                        ));
                    }
                    self.extend(target, items, at)?
                }
                b's' => {
                    let v = self.pop()?;
                    let k = self.pop()?;
                    let target = self.top()?;
                    self.set_items(target, vec![k, v], at)?
                }
                b'u' => {
                    let items = self.pop_mark()?;
                    let target = self.top()?;
                    self.set_items(target, items, at)?
                }
                b'h' => {
                    let k = self.u8()?;
                    self.memo_get(k.into(), at)?
                }
                b'j' => {
                    let k = self.u32()?;
                    self.memo_get(k, at)?
                }
                b'q' => {
                    let k = self.u8()?;
                    self.memo_put(k.into())?
                }
                b'r' => {
                    let k = self.u32()?;
                    self.memo_put(k)?
                }
                0x94 => {
                    let k = u32::try_from(self.memo.len())
                        .map_err(|_| format!("memo overflow at offset {at}"))?;
                    self.memo_put(k)?
                }
                b'c' => {
                    let module = self.line()?;
                    let name = self.line()?;
                    let module = Self::utf8(module, at)?;
                    let name = Self::utf8(name, at)?;
                    self.global(&module, &name, at)?
                }
                0x93 => {
                    let name = self.pop()?;
                    let module = self.pop()?;
                    match (self.val(module), self.val(name)) {
                        (Val::Str(m), Val::Str(n)) => {
                            let g = Global::lookup(m, n).ok_or_else(|| refused(m, n, at))?;
                            self.push_new(Val::Global(g))?
                        }
                        _ => {
                            return Err(format!(
                                "STACK_GLOBAL at offset {at} on {} and {}",
                                self.kind(module),
                                self.kind(name)
                            ))
                        }
                    }
                }
                b'Q' => {
                    let pid = self.pop()?;
                    self.persistent_load(pid, at)?
                }
                b'R' => {
                    let args = self.pop()?;
                    let callable = self.pop()?;
                    let id = self.call(callable, args, at)?;
                    self.stack.push(id)
                }
                0x81 | 0x92 => {
                    // NEWOBJ(_EX): cls.__new__(cls, *args): only an OrderedDict, empty.
                    if op == 0x92 {
                        let kwargs = self.pop()?;
                        if !matches!(self.val(kwargs), Val::Dict(d) if d.is_empty()) {
                            return Err(format!("NEWOBJ_EX with keyword arguments at offset {at}"));
                        }
                    }
                    let args = self.pop()?;
                    let cls = self.pop()?;
                    if !matches!(self.val(cls), Val::Global(Global::OrderedDict)) {
                        return Err(format!(
                            "{} at offset {at} instantiates {}, not an OrderedDict",
                            opcode_name(op),
                            self.kind(cls)
                        ));
                    }
                    let id = self.call(cls, args, at)?;
                    self.stack.push(id)
                }
                b'b' => {
                    // BUILD: state for the object below. Torch sets `_metadata` on its state
                    // dicts this way; attributes of a dict are kept by nobody here.
                    let _state = self.pop()?;
                    let obj = self.top()?;
                    if !matches!(self.val(obj), Val::Dict(_)) {
                        return Err(format!(
                            "BUILD on {} at offset {at} (torch builds only dicts)",
                            self.kind(obj)
                        ));
                    }
                }
                _ => {
                    let what = match opcode_name(op) {
                        "unknown" => "unknown opcode".to_string(),
                        name => format!("unsupported opcode {name}"),
                    };
                    return Err(format!(
                        "{what} 0x{op:02x} ('{}') at offset {at}",
                        (op as char).escape_default()
                    ));
                }
            }
        }
    }
}

/// The error for a global outside the allow-list (names clipped: they come from the file).
fn refused(module: &str, name: &str, at: usize) -> String {
    let clip = |s: &str| {
        s.chars()
            .take(120)
            .collect::<String>()
            .escape_debug()
            .to_string()
    };
    format!(
        "refers to the global '{}.{}' (offset {at}), which a torch state dict never needs: \
         refused (allowed: {ALLOWED_GLOBALS})",
        clip(module),
        clip(name)
    )
}

/// LONG1/LONG4: a little-endian two's-complement integer.
fn little_endian_int(bytes: &[u8]) -> Val {
    if bytes.is_empty() {
        return Val::Int(0);
    }
    if bytes.len() > 8 {
        // Sign-extension bytes beyond the 8th would still fit; anything else does not.
        let (low, high) = bytes.split_at(8);
        let negative = low[7] & 0x80 != 0;
        let ext = if negative { 0xff } else { 0 };
        if high.iter().any(|&b| b != ext) {
            return Val::BigInt;
        }
        return little_endian_int(low);
    }
    let negative = bytes[bytes.len() - 1] & 0x80 != 0;
    let mut a = [if negative { 0xff } else { 0 }; 8];
    a[..bytes.len()].copy_from_slice(bytes);
    Val::Int(i64::from_le_bytes(a))
}

/// INT / LONG text forms (`01` and `00` are True and False).
fn text_int(line: &[u8], long: bool) -> Option<Val> {
    let s = std::str::from_utf8(line).ok()?;
    let s = if long {
        s.strip_suffix('L').unwrap_or(s)
    } else {
        s
    };
    if !long && s == "00" {
        return Some(Val::Bool(false));
    }
    if !long && s == "01" {
        return Some(Val::Bool(true));
    }
    let digits = s.strip_prefix(['-', '+']).unwrap_or(s);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(s.parse::<i64>().map_or(Val::BigInt, Val::Int))
}

// ---------------------------------------------------------------------------------------------
// The checkpoint

/// What a torch checkpoint says about one tensor: dtype, shape, and where its elements lie in
/// which storage. Validated against the storage entry when the checkpoint is opened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PthTensorInfo {
    dtype: TorchDtype,
    candle: DType,
    shape: Vec<usize>,
    strides: Vec<usize>,
    storage: String,
    offset: usize,
    /// Where the bytes of the view's extent (first to last element) lie in the file.
    span: Range<usize>,
}

impl PthTensorInfo {
    /// The candle dtype the tensor loads as (`bool` loads as `U8`, 0 or 1).
    pub fn dtype(&self) -> DType {
        self.candle
    }

    /// The dtype as torch names it (`float32`, `bool`, ...).
    pub fn torch_dtype(&self) -> &'static str {
        self.dtype.desc().name
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The strides, in elements (a contiguous tensor's are row-major).
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }

    /// Number of elements.
    pub fn elem_count(&self) -> usize {
        self.shape.iter().product()
    }

    /// The key of the storage it views (`<archive>/data/<key>` in the zip).
    pub fn storage_key(&self) -> &str {
        &self.storage
    }

    /// The offset of its first element in the storage, in elements.
    pub fn storage_offset(&self) -> usize {
        self.offset
    }

    fn is_contiguous(&self) -> bool {
        let mut expected = 1usize;
        for (&d, &s) in self.shape.iter().zip(&self.strides).rev() {
            if d != 1 && s != expected {
                return false;
            }
            expected *= d;
        }
        true
    }
}

/// Where the checkpoint's bytes are: in memory ([`PthCheckpoint::from_bytes`]), or in the
/// file, read by position when a tensor loads ([`PthCheckpoint::open`]: only the zip directory
/// and the pickle are read when it opens, so a model's memory is its tensors, once).
enum Source {
    Owned(Vec<u8>),
    File(Mutex<std::fs::File>),
}

impl Source {
    /// Calls `f` on the bytes at `range` (validated against the length when the checkpoint
    /// opened; a file that has shrunk since gives an error).
    fn with<T>(&self, range: Range<usize>, f: impl FnOnce(&[u8]) -> T) -> std::io::Result<T> {
        match self {
            Source::Owned(v) => Ok(f(&v[range])),
            Source::File(file) => {
                let mut buf = vec![0u8; range.len()];
                // A poisoned lock only means another load panicked mid-read; the file handle
                // itself is fine (every read seeks first).
                let mut file = file.lock().unwrap_or_else(|p| p.into_inner());
                file.seek(SeekFrom::Start(range.start as u64))?;
                file.read_exact(&mut buf)?;
                Ok(f(&buf))
            }
        }
    }
}

struct Inner {
    origin: String,
    source: Source,
    big_endian: bool,
    tensors: BTreeMap<String, PthTensorInfo>,
}

/// A torch zip checkpoint (`torch.save(state_dict)` since torch 1.6), read and validated by
/// this crate's own unpickler. Cheap to clone (clones share the file or bytes). Tensors are
/// read one at a time by [`PthCheckpoint::load`].
///
/// The format: a zip archive holding `<name>/data.pkl` (a pickle of the state dict whose
/// tensors refer to storages by key), one entry `<name>/data/<key>` per storage (raw
/// elements, stored uncompressed), `<name>/version`, and since torch 1.10 `<name>/byteorder`.
/// The reader is built so that a hostile file gets an error naming the file and the key or
/// tensor at fault, never a crash, a blow-up or a silent wrong answer:
///
/// * **No recursion.** Objects live in a flat arena and refer to each other by index; the
///   unpickler, the walk that collects tensors and dropping the arena are all loops. Nesting
///   (open `MARK`s, and containers inside containers) is limited to 256 levels: deeper is an
///   error ("nesting deeper than 256"); no state dict nests more than a few.
/// * **Shared memo values.** `BINGET` pushes the index of the memoised object, it never copies
///   it, so a pickle that references one object 2⁴⁰ times costs nothing. A dict reached twice
///   while collecting tensors (a memo trick that would multiply the names) is an error.
/// * **Budgets.** Every length read from the stream is checked against the bytes that remain
///   before anything is allocated; the objects and container slots built are bounded by the
///   pickle's size (each opcode builds at most one object), the pickle by 128 MiB, the tensor
///   names by a multiple of the pickle's size, and a loaded tensor by its storage entry, so
///   loading never allocates more than the file holds.
/// * **A global allow-list**, of exactly what `torch.save` writes for state dicts of dense
///   tensors (torch 2.15, protocols 1 to 5): `collections.OrderedDict`,
///   `torch._utils._rebuild_tensor_v2`, `_rebuild_tensor_v3`, `_rebuild_parameter`,
///   `_rebuild_parameter_with_state`, `torch._tensor._rebuild_from_type_v2` (with
///   `torch.Tensor` or `torch.nn.parameter.Parameter` as its type), the typed storage classes
///   `torch.<X>Storage`, `torch.storage.UntypedStorage` and the `torch.<dtype>` names that
///   `_rebuild_tensor_v3` takes. Any other global anywhere in the pickle (`posix.system`,
///   `subprocess.Popen`, a model class, ...) is refused with an error naming it, even under a
///   key nobody reads. Nothing is ever called: this reader interprets the allowed globals
///   itself (an `OrderedDict` becomes a dict, `_rebuild_tensor_v2` a tensor description).
/// * **Opcodes**: those of protocols 1 to 5 that only build data. `INST`/`OBJ`, extension
///   codes, text persistent ids, out-of-band buffers and unknown bytes are errors naming the
///   opcode and its offset.
/// * **Validated at open.** Every named tensor is checked against its storage entry: a dtype
///   candle can represent, storage size × element size within the zip entry (stored, inside
///   the file), shape and strides non-negative without overflow, no more elements than the
///   storage, offset + extent inside it. Describing a file (`attn inspect`) thus already fails
///   for one that lies, and so does a checkpoint with no tensor.
///
/// Names: the tensors of the root dict, and of dicts nested in it under dotted names
/// (`{"model": state_dict}` gives `model.*`); other values (ints, strings, lists) are ignored.
/// A broadcast view (stride 0) with more elements than its storage is refused (save it
/// `.contiguous()`); a compressed (deflated) zip entry too, as `torch.save` never writes one.
#[derive(Clone)]
pub struct PthCheckpoint {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for PthCheckpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PthCheckpoint")
            .field("origin", &self.inner.origin)
            .field("tensors", &self.inner.tensors.len())
            .finish()
    }
}

fn error(origin: &str, msg: impl std::fmt::Display) -> candle::Error {
    candle::Error::Msg(format!("{origin}: {msg}"))
}

/// The byte range of a stored zip entry in the file (of `len` bytes), or why it cannot be read.
fn entry_range<R: Read + Seek>(
    zip: &mut zip::ZipArchive<R>,
    index: usize,
    len: usize,
) -> Result<Range<usize>, String> {
    let file = zip.by_index_raw(index).map_err(|e| e.to_string())?;
    if file.encrypted() {
        return Err("is encrypted".into());
    }
    if file.compression() != zip::CompressionMethod::Stored {
        return Err(format!(
            "is compressed ({}); torch.save stores entries uncompressed, and this reader reads \
             only those: re-save the checkpoint with torch.save",
            file.compression()
        ));
    }
    if file.compressed_size() != file.size() {
        return Err(format!(
            "is stored with {} bytes but declares {} uncompressed",
            file.compressed_size(),
            file.size()
        ));
    }
    let start = file.data_start().ok_or("has no data offset")?;
    let end = start.checked_add(file.size());
    match (
        usize::try_from(start),
        end.and_then(|e| usize::try_from(e).ok()),
    ) {
        (Ok(s), Some(e)) if e <= len => Ok(s..e),
        _ => Err(format!(
            "declares {} bytes at offset {start}, past the end of the file ({len} bytes)",
            file.size()
        )),
    }
}

impl PthCheckpoint {
    /// Opens and validates the checkpoint at `path`: the zip archive, the pickle, every
    /// global, every tensor against its storage entry. Only the zip directory and the pickle
    /// are read now; [`PthCheckpoint::load`] reads a tensor's bytes from the file. Errors name
    /// the file and the tensor or key at fault.
    pub fn open(path: impl AsRef<Path>) -> candle::Result<Self> {
        let path = path.as_ref();
        let origin = path.display().to_string();
        let cannot_read = |e: std::io::Error| error(&origin, format!("cannot read: {e}"));
        // Two handles, so that the zip reader's buffered position and our reads by position
        // never share a file offset.
        let file = std::fs::File::open(path).map_err(cannot_read)?;
        let len = file.metadata().map_err(cannot_read)?.len();
        let len = usize::try_from(len)
            .map_err(|_| error(&origin, format!("is {len} bytes, too large to address")))?;
        let zip_reader = std::io::BufReader::new(std::fs::File::open(path).map_err(cannot_read)?);
        let source = Source::File(Mutex::new(file));
        let (tensors, big_endian) = read_archive(zip_reader, len, &source, &origin)?;
        Ok(Self::new(origin, source, big_endian, tensors))
    }

    /// Validates `bytes` as a torch checkpoint; `origin` names it in error messages.
    pub fn from_bytes(bytes: Vec<u8>, origin: impl Into<String>) -> candle::Result<Self> {
        let origin = origin.into();
        let source = Source::Owned(bytes);
        let Source::Owned(b) = &source else {
            unreachable!()
        };
        let (tensors, big_endian) = read_archive(
            std::io::Cursor::new(b.as_slice()),
            b.len(),
            &source,
            &origin,
        )?;
        Ok(Self::new(origin, source, big_endian, tensors))
    }

    fn new(
        origin: String,
        source: Source,
        big_endian: bool,
        tensors: BTreeMap<String, PthTensorInfo>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                origin,
                source,
                big_endian,
                tensors,
            }),
        }
    }

    /// Where the checkpoint came from (its path for [`PthCheckpoint::open`]).
    pub fn origin(&self) -> &str {
        &self.inner.origin
    }

    /// Every tensor name, sorted.
    pub fn names(&self) -> Vec<&str> {
        self.inner.tensors.keys().map(String::as_str).collect()
    }

    /// Whether a tensor called `name` is stored.
    pub fn contains(&self, name: &str) -> bool {
        self.inner.tensors.contains_key(name)
    }

    /// Dtype, shape and storage location of `name`, without reading its data.
    pub fn info(&self, name: &str) -> Option<&PthTensorInfo> {
        self.inner.tensors.get(name)
    }

    /// Number of tensors (never 0: an empty checkpoint is refused by `open`).
    pub fn tensor_count(&self) -> usize {
        self.inner.tensors.len()
    }

    /// Reads `name` onto `device` in its stored dtype (`bool` as `U8`), honouring its strides
    /// and offset (a view of a shared storage gets exactly its own elements, contiguous) and
    /// the recorded byte order.
    pub fn load(&self, name: &str, device: &Device) -> candle::Result<Tensor> {
        let info = self.inner.tensors.get(name).ok_or_else(|| {
            let names = self.names();
            let shown: Vec<&str> = names.iter().take(12).copied().collect();
            error(
                &self.inner.origin,
                format!(
                    "tensor '{name}' not found ({} tensors: {}{})",
                    names.len(),
                    shown.join(", "),
                    if names.len() > shown.len() {
                        ", ..."
                    } else {
                        ""
                    }
                ),
            )
        })?;
        let size = info.dtype.desc().size;
        let mut buf: Vec<u8> = self
            .inner
            .source
            .with(info.span.clone(), |extent| {
                if info.is_contiguous() {
                    extent.to_vec()
                } else {
                    gather(extent, info, size)
                }
            })
            .map_err(|e| {
                error(
                    &self.inner.origin,
                    format!("tensor '{name}': cannot read its storage: {e}"),
                )
            })?;
        if self.inner.big_endian != cfg!(target_endian = "big") && size > 1 {
            for e in buf.chunks_exact_mut(size) {
                e.reverse();
            }
        }
        if info.dtype.desc().name == "bool" {
            for b in &mut buf {
                *b = u8::from(*b != 0);
            }
        }
        Tensor::from_raw_buffer(&buf, info.candle, &info.shape, device)
            .map_err(|e| error(&self.inner.origin, format!("tensor '{name}': {e}")))
    }
}

/// The elements of a strided view, in row-major order, from the bytes of its extent (its
/// first element first; validated at open: every index is inside it).
fn gather(extent: &[u8], info: &PthTensorInfo, size: usize) -> Vec<u8> {
    let n = info.elem_count();
    let mut out = Vec::with_capacity(n * size);
    if n == 0 {
        return out;
    }
    let storage = extent;
    let rank = info.shape.len();
    let mut index = vec![0usize; rank];
    let mut at = 0usize;
    loop {
        out.extend_from_slice(&storage[at * size..(at + 1) * size]);
        // Odometer over the dimensions, last fastest. Wrapping arithmetic: the position may
        // step past the storage between two elements (never at one: validated at open).
        let mut d = rank;
        loop {
            if d == 0 {
                return out;
            }
            d -= 1;
            index[d] += 1;
            at = at.wrapping_add(info.strides[d]);
            if index[d] < info.shape[d] {
                break;
            }
            at = at.wrapping_sub(info.strides[d].wrapping_mul(info.shape[d]));
            index[d] = 0;
        }
    }
}

/// Reads the zip archive (`reader`, `len` bytes; `source` for the entries' bytes): the pickle,
/// then the table of named tensors, each validated against its storage entry. Returns the
/// table and whether the storages are big-endian.
fn read_archive<R: Read + Seek>(
    reader: R,
    len: usize,
    source: &Source,
    origin: &str,
) -> candle::Result<(BTreeMap<String, PthTensorInfo>, bool)> {
    let cannot_read = |e: std::io::Error| error(origin, format!("cannot read: {e}"));
    let magic = source
        .with(0..len.min(2), <[u8]>::to_vec)
        .map_err(cannot_read)?;
    if magic.first() == Some(&0x80) {
        return Err(error(
            origin,
            "is a pickle, not a zip archive: the legacy torch.save format (before torch 1.6, or \
             _use_new_zipfile_serialization=False) is not supported; re-save it with a newer torch",
        ));
    }
    let mut zip = zip::ZipArchive::new(reader).map_err(|e| {
        error(
            origin,
            format!(
                "is not a torch checkpoint (a zip archive written by torch.save): {e} ({len} bytes)"
            ),
        )
    })?;
    // torch's reader: the archive's name is the first entry's directory.
    let first = zip.file_names_raw().next().map(<[u8]>::to_vec);
    let prefix = match first
        .as_deref()
        .and_then(|f| f.iter().position(|&b| b == b'/').map(|i| &f[..i]))
    {
        Some(p) if !p.is_empty() => String::from_utf8_lossy(p).into_owned(),
        _ => {
            return Err(error(
                origin,
                "is a zip archive but not a torch checkpoint: its entries are not under one \
                 <name>/ directory with a data.pkl",
            ))
        }
    };
    let entry =
        |zip: &mut zip::ZipArchive<R>, name: &str| -> candle::Result<Option<Range<usize>>> {
            match zip.index_for_name_raw(name.as_bytes()) {
                None => Ok(None),
                Some(i) => entry_range(zip, i, len)
                    .map(Some)
                    .map_err(|e| error(origin, format!("zip entry '{name}' {e}"))),
            }
        };
    let pkl_name = format!("{prefix}/data.pkl");
    let pkl = entry(&mut zip, &pkl_name)?.ok_or_else(|| {
        error(
            origin,
            format!("is a zip archive without {pkl_name}: not a torch checkpoint"),
        )
    })?;
    if pkl.len() > MAX_PICKLE_BYTES {
        return Err(error(
            origin,
            format!(
                "{pkl_name} is {} bytes, more than the {MAX_PICKLE_BYTES} this reader accepts",
                pkl.len()
            ),
        ));
    }
    let byteorder = match entry(&mut zip, &format!("{prefix}/byteorder"))? {
        None => None,
        Some(r) => {
            let r = r.start..r.end.min(r.start + 32);
            Some(source.with(r, <[u8]>::to_vec).map_err(cannot_read)?)
        }
    };
    let big_endian = match byteorder.as_deref() {
        None => false,
        Some(order) => match order {
            b"little" => false,
            b"big" => true,
            other => {
                return Err(error(
                    origin,
                    format!(
                        "{prefix}/byteorder says '{}', neither 'little' nor 'big'",
                        String::from_utf8_lossy(other).escape_debug()
                    ),
                ))
            }
        },
    };
    let data = source.with(pkl, <[u8]>::to_vec).map_err(cannot_read)?;
    let mut up = Unpickler::new(&data);
    let root = up
        .run()
        .map_err(|e| error(origin, format!("{pkl_name}: {e}")))?;
    let mut storages: HashMap<String, (TorchDtype, usize, Range<usize>)> = HashMap::new();
    let mut tensors = BTreeMap::new();
    // Real state dicts have a few dimensions per 100 pickle bytes.
    let mut dims = data.len() / 4 + 4096;
    let named =
        collect_tensors(&up, root).map_err(|e| error(origin, format!("{pkl_name}: {e}")))?;
    for (name, id) in named {
        let Val::Tensor(raw) = up.val(id) else {
            unreachable!("collect_tensors returns tensors")
        };
        let info = tensor_info(&up, raw, &prefix, &mut storages, &mut dims, &mut |key| {
            entry(&mut zip, &format!("{prefix}/data/{key}"))
        })
        .map_err(|e| match e {
            Failure::Msg(m) => error(origin, format!("tensor '{name}' {m}")),
            Failure::Candle(e) => e,
        })?;
        if tensors.insert(name.clone(), info).is_some() {
            return Err(error(
                origin,
                format!("{pkl_name}: the tensor name '{name}' occurs twice"),
            ));
        }
    }
    if tensors.is_empty() {
        return Err(error(
            origin,
            "holds no tensor: the state dict is empty (or holds no tensor at its top level or \
             in nested dicts)",
        ));
    }
    Ok((tensors, big_endian))
}

/// The named tensors: those of the root dict and, under `outer.` names, of dicts nested in
/// it (an explicit work list: no recursion). A dict reached twice is an error, so shared memo
/// entries cannot multiply the names.
fn collect_tensors(up: &Unpickler<'_>, root: Id) -> PResult<Vec<(String, Id)>> {
    if !matches!(up.val(root), Val::Dict(_)) {
        return Err(format!(
            "the pickled object is {}, not a state dict (a dict of tensors)",
            up.kind(root)
        ));
    }
    // Names are bounded like everything else: each is a key (bytes of the pickle) under a
    // prefix of at most MAX_DEPTH keys; their total by a multiple of the pickle's size.
    let budget = 8 * up.data.len() + (1 << 16);
    let mut spent = 0usize;
    let mut out = Vec::new();
    let mut seen: HashSet<Id> = HashSet::new();
    let mut work = vec![(root, String::new())];
    seen.insert(root);
    while let Some((dict, prefix)) = work.pop() {
        let Val::Dict(items) = up.val(dict) else {
            unreachable!("only dicts are queued")
        };
        for &(k, v) in items {
            let key = match up.val(k) {
                Val::Str(s) => s.to_string(),
                Val::Int(i) => i.to_string(),
                _ => {
                    if matches!(up.val(v), Val::Tensor(_)) {
                        return Err(format!(
                            "a tensor under '{prefix}' has {} as its key",
                            up.kind(k)
                        ));
                    }
                    continue;
                }
            };
            match up.val(v) {
                Val::Tensor(_) | Val::Dict(_) => {
                    let name = format!("{prefix}{key}");
                    spent += name.len();
                    if spent > budget {
                        return Err(format!("the tensor names total more than {budget} bytes"));
                    }
                    if matches!(up.val(v), Val::Tensor(_)) {
                        out.push((name, v));
                    } else if !seen.insert(v) {
                        return Err(format!(
                            "the dict under '{name}' is also stored under another key (a shared \
                             memo entry): refused"
                        ));
                    } else {
                        work.push((v, format!("{name}.")));
                    }
                }
                _ => {}
            }
        }
    }
    Ok(out)
}

enum Failure {
    Msg(String),
    Candle(candle::Error),
}

impl From<String> for Failure {
    fn from(s: String) -> Self {
        Self::Msg(s)
    }
}

/// Checks one tensor against its storage entry (`entry` finds `data/<key>`), remembering each
/// storage's dtype and size so that two views of one storage agree; `dims` is what remains of
/// the budget of dimensions.
fn tensor_info(
    up: &Unpickler<'_>,
    raw: &RawTensor,
    prefix: &str,
    storages: &mut HashMap<String, (TorchDtype, usize, Range<usize>)>,
    dims: &mut usize,
    entry: &mut dyn FnMut(&str) -> candle::Result<Option<Range<usize>>>,
) -> Result<PthTensorInfo, Failure> {
    let Val::Storage(s) = up.val(raw.storage) else {
        unreachable!("checked when the tensor was rebuilt")
    };
    let key = &*s.key;
    let dtype = raw
        .dtype
        .or(s.dtype)
        .expect("v2 has a typed storage, v3 a dtype");
    let candle = dtype.candle()?;
    let size = dtype.desc().size;
    if s.numel < 0 {
        return Err(format!("has storage '{key}' of negative size {}", s.numel).into());
    }
    let numel = s.numel as u64;
    // Typed storages count elements; untyped ones (v3) bytes.
    let elements = if s.dtype.is_some() {
        numel
    } else {
        if !numel.is_multiple_of(size as u64) {
            return Err(format!(
                "has an untyped storage '{key}' of {numel} bytes, not a whole number of {} \
                 elements of {size} bytes",
                dtype.desc().name
            )
            .into());
        }
        numel / size as u64
    };
    let (elements, data) = match storages.get(key) {
        Some((d, e, r)) => {
            if *d != dtype || *e as u64 != elements {
                return Err(format!(
                    "views storage '{key}' as {elements} elements of {}, another tensor as {e} of \
                     {}",
                    dtype.desc().name,
                    d.desc().name
                )
                .into());
            }
            (*e, r.clone())
        }
        None => {
            let data = entry(key).map_err(Failure::Candle)?.ok_or_else(|| {
                format!("refers to storage '{key}', but {prefix}/data/{key} is missing")
            })?;
            let fits = elements
                .checked_mul(size as u64)
                .is_some_and(|b| b <= data.len() as u64);
            if !fits {
                return Err(format!(
                    "has storage '{key}' of {elements} elements of {} ({size} bytes each), but \
                     its entry {prefix}/data/{key} holds {} bytes",
                    dtype.desc().name,
                    data.len()
                )
                .into());
            }
            let elements = elements as usize;
            storages.insert(key.to_string(), (dtype, elements, data.clone()));
            (elements, data)
        }
    };
    if raw.lazy_bits {
        return Err(
            "is a lazily conjugated or negated view (tensor metadata); save it with \
             .resolve_conj().resolve_neg()"
                .to_string()
                .into(),
        );
    }
    let (raw_size, raw_stride) = (up.ints(raw.size), up.ints(raw.stride));
    // Shapes and strides are kept per tensor name: bounded in total, like the names.
    *dims = dims.checked_sub(raw_size.len()).ok_or_else(|| {
        "takes the tensors' dimensions past what the pickle's size allows (a memo trick)"
            .to_string()
    })?;
    let layout = || {
        format!(
            "shape {raw_size:?}, strides {raw_stride:?}, offset {}",
            raw.offset
        )
    };
    let to_usize = |v: &[i64], what: &str| -> Result<Vec<usize>, Failure> {
        v.iter()
            .map(|&x| usize::try_from(x))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| Failure::Msg(format!("has a negative {what} ({})", layout())))
    };
    let shape = to_usize(&raw_size, "dimension")?;
    let strides = to_usize(&raw_stride, "stride")?;
    let offset = usize::try_from(raw.offset)
        .map_err(|_| Failure::Msg(format!("has a negative storage offset ({})", layout())))?;
    let count = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .filter(|&c| c <= elements)
        .ok_or_else(|| {
            let hint = if strides.contains(&0) {
                " (a broadcast view, stride 0: save it .contiguous())"
            } else {
                ""
            };
            format!(
                "has shape {shape:?}, more elements than its storage '{key}' holds \
                 ({elements}){hint}"
            )
        })?;
    // The elements the view spans, from its first to its last.
    let extent = if count > 0 {
        // The furthest element: offset + Σ (d - 1) · stride, inside the storage.
        let last = shape.iter().zip(&strides).try_fold(offset, |a, (&d, &s)| {
            (d - 1).checked_mul(s).and_then(|x| a.checked_add(x))
        });
        match last {
            Some(l) if l < elements => offset..l + 1,
            _ => {
                return Err(format!(
                    "reaches past the end of its storage '{key}' of {elements} elements ({})",
                    layout()
                )
                .into())
            }
        }
    } else if offset > elements {
        return Err(format!(
            "starts past the end of its storage '{key}' of {elements} elements ({})",
            layout()
        )
        .into());
    } else {
        offset..offset
    };
    // In bytes, in the file (elements · size fits in the entry: checked above).
    let span = data.start + extent.start * size..data.start + extent.end * size;
    Ok(PthTensorInfo {
        dtype,
        candle,
        shape,
        strides,
        storage: key.to_string(),
        offset,
        span,
    })
}

#[cfg(test)]
mod tests;
