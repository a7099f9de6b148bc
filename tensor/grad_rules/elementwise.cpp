// Gradient rules of the elementwise ops (see grad_rules.h). g is the gradient
// of the output; a binary op's gradients are summed back to each operand's
// shape (sumTo), undoing the broadcast.
#include "kernels/cpu/elementwise.h"
#include "kernels/cuda_call.h"
#ifdef WEFT_HAVE_CUDA
#include "kernels/cuda/elementwise.h"
#endif
#include "tensor/autograd.h"
#include "tensor/grad_rules/grad_rules.h"
#include "tensor/ops_elementwise.h"
#include "tensor/ops_reduce.h"

namespace weft::grad_rules {

using Grads = std::vector<Tensor>;
using kernels::cpu::UnaryOp;

// d/da = g, d/db = g
void addBackward(const Tensor& a, const Tensor& b, const Tensor& out) {
  if (!anyRequiresGrad({&a, &b})) return;
  Shape as = a.shape(), bs = b.shape();
  recordOp("AddBackward", {a, b}, {out}, [as, bs](const Grads& g) { return Grads{sumTo(g[0], as), sumTo(g[0], bs)}; });
}

// d/da = g, d/db = -g
void subBackward(const Tensor& a, const Tensor& b, const Tensor& out) {
  if (!anyRequiresGrad({&a, &b})) return;
  Shape as = a.shape(), bs = b.shape();
  recordOp("SubBackward", {a, b}, {out},
           [as, bs](const Grads& g) { return Grads{sumTo(g[0], as), sumTo(neg(g[0]), bs)}; });
}

// d/da = g·b, d/db = g·a (each operand kept only for the other's gradient)
void mulBackward(const Tensor& a, const Tensor& b, const Tensor& out) {
  if (!anyRequiresGrad({&a, &b})) return;
  SavedTensor sa(b.requiresGrad() ? a : Tensor()), sb(a.requiresGrad() ? b : Tensor());
  Shape as = a.shape(), bs = b.shape();
  recordOp("MulBackward", {a, b}, {out}, [sa, sb, as, bs](const Grads& g) {
    Tensor va = sa.unpack("MulBackward"), vb = sb.unpack("MulBackward");
    return Grads{vb.defined() ? sumTo(mul(g[0], vb), as) : Tensor(),
                 va.defined() ? sumTo(mul(g[0], va), bs) : Tensor()};
  });
}

// d/da = g/b, d/db = -g·a/b²
void divBackward(const Tensor& a, const Tensor& b, const Tensor& out) {
  if (!anyRequiresGrad({&a, &b})) return;
  SavedTensor sa(b.requiresGrad() ? a : Tensor()), sb(b);
  Shape as = a.shape(), bs = b.shape();
  recordOp("DivBackward", {a, b}, {out}, [sa, sb, as, bs](const Grads& g) {
    Tensor va = sa.unpack("DivBackward"), vb = sb.unpack("DivBackward");
    Tensor ga = sumTo(div(g[0], vb), as);
    Tensor gb = va.defined() ? sumTo(neg(div(mul(g[0], va), mul(vb, vb))), bs) : Tensor();
    return Grads{ga, gb};
  });
}

namespace {

// Gradient routing for maximum/minimum: to the winner, split equally on ties.
Tensor selectMask(const Tensor& winner, const Tensor& loser, DType dt) {
  NoGradGuard ng;
  Tensor w = gt(winner, loser).to(dt);
  Tensor tie = eq(winner, loser).to(dt);
  return add(w, mul(tie, 0.5));
}

// d/da = g·[a wins] (half on a tie), d/db = g - d/da
void extremumBackward(const char* name, bool isMax, const Tensor& a, const Tensor& b, const Tensor& out) {
  if (!anyRequiresGrad({&a, &b})) return;
  SavedTensor sa(a), sb(b);
  Shape as = a.shape(), bs = b.shape();
  recordOp(name, {a, b}, {out}, [sa, sb, as, bs, isMax, name](const Grads& g) {
    Tensor va = sa.unpack(name), vb = sb.unpack(name);
    Tensor ma = isMax ? selectMask(va, vb, g[0].dtype()) : selectMask(vb, va, g[0].dtype());
    Tensor ga = mul(g[0], ma);
    Tensor gb = sub(g[0], ga);
    return Grads{sumTo(ga, as), sumTo(gb, bs)};
  });
}

}  // namespace

void maximumBackward(const Tensor& a, const Tensor& b, const Tensor& out) {
  extremumBackward("MaximumBackward", true, a, b, out);
}

void minimumBackward(const Tensor& a, const Tensor& b, const Tensor& out) {
  extremumBackward("MinimumBackward", false, a, b, out);
}

// d/da = g·e·a^(e-1), d/de = g·out·log(a)
void powTensorBackward(const Tensor& a, const Tensor& e, const Tensor& out) {
  if (!anyRequiresGrad({&a, &e})) return;
  SavedTensor sa(a), se(e), so(out);
  Shape as = a.shape(), es = e.shape();
  bool needE = e.requiresGrad();
  recordOp("PowTensorBackward", {a, e}, {out}, [sa, se, so, as, es, needE](const Grads& g) {
    Tensor va = sa.unpack("PowTensorBackward"), ve = se.unpack("PowTensorBackward");
    Tensor ga = sumTo(mul(g[0], mul(ve, pow(va, sub(ve, onesLike(ve))))), as);
    Tensor ge = needE ? sumTo(mul(g[0], mul(so.unpack("PowTensorBackward"), log(va))), es) : Tensor();
    return Grads{ga, ge};
  });
}

// d/da = g where cond, else 0; d/db = g where not cond (each summed back to
// its operand's shape)
void whereBackward(const char* name, const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) {
  if (!anyRequiresGrad({&a, &b})) return;
  SavedTensor sc(cond);
  Shape as = a.shape(), bs = b.shape();
  bool needA = a.requiresGrad(), needB = b.requiresGrad();
  recordOp(name, {a, b}, {out}, [sc, as, bs, needA, needB, name](const Grads& g) {
    Tensor c = sc.unpack(name);
    Tensor zero = zeros({}, {.dtype = g[0].dtype()});
    return Grads{needA ? sumTo(where(c, g[0], zero), as) : Tensor(),
                 needB ? sumTo(where(c, zero, g[0]), bs) : Tensor()};
  });
}

// d/dx = g with the same triangle kept
void triangleBackward(bool upper, int64_t diagonal, const Tensor& x, const Tensor& out) {
  if (!anyRequiresGrad({&x})) return;
  recordOp(upper ? "TriuBackward" : "TrilBackward", {x}, {out}, [upper, diagonal](const Grads& g) {
    return Grads{upper ? triu(g[0], diagonal) : tril(g[0], diagonal)};
  });
}

// ---- unary ops ------------------------------------------------------------------
// One kernel computes every unary derivative (kernels::cpu::unaryBackward);
// the table says which of the input x and the output y it reads, so that
// only those are saved.

namespace {

struct UnaryReads {
  bool x, y;
};

UnaryReads unaryReads(UnaryOp op) {
  switch (op) {
    //                                x      y          d/dx
    case UnaryOp::Neg:        return {false, false};  // -g
    case UnaryOp::Exp:        return {false, true};   // g·y
    case UnaryOp::Log:        return {true,  false};  // g/x
    case UnaryOp::Sqrt:       return {false, true};   // g/(2y)
    case UnaryOp::Abs:        return {true,  false};  // g·sign(x)
    case UnaryOp::Sign:       return {false, false};  // 0
    case UnaryOp::Relu:       return {true,  false};  // g·[x > 0]
    case UnaryOp::Tanh:       return {false, true};   // g·(1 - y²)
    case UnaryOp::Sigmoid:    return {false, true};   // g·y·(1 - y)
    case UnaryOp::Gelu:       return {true,  false};  // g·(Φ(x) + x·φ(x))
    case UnaryOp::PowScalar:  return {true,  false};  // g·p·x^(p-1), 0 when p = 0
    case UnaryOp::Clamp:      return {true,  false};  // g·[lo <= x <= hi]
    case UnaryOp::AddScalar:  return {false, false};  // g
    case UnaryOp::MulScalar:  return {false, false};  // g·s
    case UnaryOp::Square:     return {true,  false};  // 2·x·g
    case UnaryOp::Reciprocal: return {false, true};   // -g·y²
  }
  return {true, true};
}

}  // namespace

void unaryBackward(UnaryOp op, const char* name, const Tensor& a, const Tensor& out, double p0, double p1) {
  if (!anyRequiresGrad({&a})) return;
  UnaryReads reads = unaryReads(op);
  SavedTensor x(reads.x ? a : Tensor()), y(reads.y ? out : Tensor());
  recordOp(name, {a}, {out}, [op, name, x, y, p0, p1](const Grads& g) {
    Tensor xi = x.unpack(name), yo = y.unpack(name);
    if (xi.defined()) xi = xi.contiguous();
    Tensor go = g[0].contiguous();
    Tensor gx = emptyLike(go);
    const void* xp = xi.defined() ? xi.rawData() : nullptr;
    const void* yp = yo.defined() ? yo.rawData() : nullptr;
    if (go.device().isCuda()) {
      WEFT_CUDA_CALL(go.device().index, unaryBackward(op, go.dtype(), xp, yp, go.rawData(), gx.rawData(), go.numel(), p0, p1));
    } else {
      kernels::cpu::unaryBackward(op, go.dtype(), xp, yp, go.rawData(), gx.rawData(), go.numel(), p0, p1);
    }
    return Grads{gx};
  });
}

}  // namespace weft::grad_rules
