"""Many L2-regularised linear models on one feature matrix, fitted together.

SentEval's protocols fit hundreds of logistic regressions per task (folds x C grid)
on subsets of the same rows. Here every problem p is a row mask and a C over one
shared matrix X, so each L-BFGS iteration is two matrix products for all problems
(X @ D for the search directions, X^T @ R for the gradients) and the line search is
elementwise on the logits. Objective of problem p (scikit-learn's, divided by C n_p):

  mean_{i in train_p} loss(y_i, x_i W_p + b_p) + ||W_p||^2 / (2 C_p n_p)

with the intercept b_p unpenalised; binary problems use one sigmoid logit and
multiclass ones a softmax over K logits (scikit-learn's lbfgs, multinomial). As the
intercept is free, centring X is an exact reparametrisation that conditions the
problems far better.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass
class LogisticFit:
  """P fitted problems: coef [P, F, K], intercept [P, K] (K = 1 for binary)."""
  coef_PxFxK: np.ndarray
  intercept_PxK: np.ndarray
  classes: np.ndarray
  n_iter_P: np.ndarray
  converged_P: np.ndarray
  theta_PxF1xK: np.ndarray  # centred parametrisation, for warm starts on the same X.

  def decision(self, x_NxF: np.ndarray) -> np.ndarray:
    """Logits [N, P, K]."""
    p, f, k = self.coef_PxFxK.shape
    coef_FxPK = self.coef_PxFxK.transpose(1, 0, 2).reshape(f, p * k)
    return (np.asarray(x_NxF, np.float64) @ coef_FxPK).reshape(-1, p, k) + self.intercept_PxK[None]

  def predict(self, x_NxF: np.ndarray) -> np.ndarray:
    """Class labels [N, P]."""
    z_NxPxK = self.decision(x_NxF)
    if z_NxPxK.shape[-1] == 1:
      return self.classes[(z_NxPxK[..., 0] > 0).astype(np.int64)]
    return self.classes[np.argmax(z_NxPxK, axis=-1)]


class _Problems:
  """Objective and gradient of the active problems, from logits z [N, K, A].

  Problems are the last (contiguous) axis so that every elementwise op and the
  reductions over classes run along long vectors.
  """

  def __init__(self, xa_NxF1, y_N1, onehot_NxKx1, weight_NxA, lam_A, k):
    self.xa_NxF1 = xa_NxF1
    self.y_N1 = y_N1
    self.onehot_NxKx1 = onehot_NxKx1
    self.y_index_N = y_N1[:, 0].astype(np.int64)
    self.weight_NxA = weight_NxA  # float64, mask / n_p
    self.lam_A = lam_A
    self.k = k

  def subset(self, keep):
    return _Problems(self.xa_NxF1, self.y_N1, self.onehot_NxKx1, self.weight_NxA[:, keep], self.lam_A[keep], self.k)

  def matmul(self, theta_AxF1xK):
    a, f1, k = theta_AxF1xK.shape
    mat = np.ascontiguousarray(theta_AxF1xK.transpose(1, 2, 0).reshape(f1, k * a), self.xa_NxF1.dtype)
    return (self.xa_NxF1 @ mat).reshape(-1, k, a)

  def evaluate(self, z_NxKxA, theta_AxF1xK):
    """Objective [A] and unweighted dloss/dz [N, K, A], from one pass of exponentials."""
    if self.k == 1:
      z_NxA = z_NxKxA[:, 0]
      e_NxA = np.exp(-np.abs(z_NxA))
      one_plus_e = 1 + e_NxA
      loss_NxA = np.maximum(z_NxA, 0) + np.log(one_plus_e) - self.y_N1 * z_NxA
      inv = 1 / one_plus_e
      resid_NxKxA = (np.where(z_NxA >= 0, inv, 1 - inv) - self.y_N1)[:, None, :]
    else:
      # Shifting by the row max is only needed where exp could overflow.
      if np.max(np.abs(z_NxKxA)) < 30:
        ez_NxKxA = np.exp(z_NxKxA)
        m_Nx1xA = 0.0
      else:
        m_Nx1xA = np.max(z_NxKxA, axis=1, keepdims=True)
        ez_NxKxA = np.exp(z_NxKxA - m_Nx1xA)
      sum_Nx1xA = np.sum(ez_NxKxA, axis=1, keepdims=True)
      picked_NxA = z_NxKxA[np.arange(len(self.y_index_N)), self.y_index_N]
      loss_NxA = (np.log(sum_Nx1xA) + m_Nx1xA)[:, 0] - picked_NxA
      resid_NxKxA = ez_NxKxA / sum_Nx1xA - self.onehot_NxKx1
    data_A = np.einsum("na,na->a", loss_NxA.astype(np.float64), self.weight_NxA)
    return data_A + 0.5 * self.lam_A * np.sum(theta_AxF1xK[:, :-1] ** 2, axis=(1, 2)), resid_NxKxA

  def gradient(self, resid_NxKxA, theta_AxF1xK):
    n, k, a = resid_NxKxA.shape
    r_NxKA = (resid_NxKxA * self.weight_NxA[:, None, :].astype(resid_NxKxA.dtype)).reshape(n, k * a)
    g_AxF1xK = (self.xa_NxF1.T @ r_NxKA).astype(np.float64).reshape(-1, k, a).transpose(2, 0, 1).copy()
    g_AxF1xK[:, :-1] += self.lam_A[:, None, None] * theta_AxF1xK[:, :-1]
    return g_AxF1xK


def fit_logistic(x_NxF: np.ndarray, y_N: np.ndarray, *, train_PxN: np.ndarray, c_P: np.ndarray,
                 init_PxF1xK: np.ndarray | None = None, tol: float = 1e-5, max_iter: int = 1000,
                 history: int = 10, dtype=np.float32) -> LogisticFit:
  """Fits P L2-regularised logistic regressions on row subsets of one matrix, together.

  Args:
    x_NxF: features of every row any problem trains or is scored on.
    y_N: labels (any integers); K = number of distinct labels.
    train_PxN: boolean, the rows problem p trains on.
    c_P: inverse regularisation strength of each problem (scikit-learn's C).
    init_PxF1xK: warm start, `LogisticFit.theta_PxF1xK` of a fit on the same x_NxF.
    tol: a problem stops when the max-abs gradient of its objective (scaled as above;
      scikit-learn's lbfgs uses the same scaling and tol 1e-4) is below this.
    max_iter: L-BFGS iterations at most.
    history: L-BFGS memory.
    dtype: of logits and matrix products. float32 is 2-4x faster; a problem whose
      line search can no longer resolve a decrease at that precision also stops.
  """
  x_NxF = np.asarray(x_NxF, np.float64)
  train_PxN = np.asarray(train_PxN, bool)
  p = train_PxN.shape[0]
  c_P = np.broadcast_to(np.asarray(c_P, np.float64), (p,))
  classes, y_idx_N = np.unique(np.asarray(y_N), return_inverse=True)
  if len(classes) < 2:
    raise ValueError("logistic regression needs at least two classes")
  n, f = x_NxF.shape
  k = 1 if len(classes) == 2 else len(classes)
  mean_F = x_NxF.mean(axis=0)
  xa_NxF1 = np.concatenate([x_NxF - mean_F, np.ones((n, 1))], axis=1).astype(dtype)
  n_P = train_PxN.sum(axis=1).astype(np.float64)
  if np.any(n_P == 0):
    raise ValueError("every problem needs at least one training row")
  onehot = np.eye(len(classes), dtype=dtype)[y_idx_N][:, :, None] if k > 1 else None
  probs = _Problems(xa_NxF1, y_idx_N.astype(dtype)[:, None], onehot, train_PxN.T / n_P[None, :], 1.0 / (c_P * n_P), k)

  theta_out = np.zeros((p, f + 1, k)) if init_PxF1xK is None else np.array(init_PxF1xK, np.float64)
  n_iter_out = np.zeros(p, np.int64)
  converged_out = np.zeros(p, bool)

  active_A = np.arange(p)
  frozen_A = np.zeros(p, bool)  # finished but not yet compacted away: they take zero steps.
  theta = theta_out.copy()
  z = probs.matmul(theta)
  obj, resid = probs.evaluate(z, theta)
  grad = probs.gradient(resid, theta)
  s_hist, y_hist, rho_hist = [], [], []
  with np.errstate(over="ignore", under="ignore"):
    for it in range(1, max_iter + 1):
      a = len(active_A)
      g_AxM = grad.reshape(a, -1)
      # Two-loop recursion, vectorised over problems.
      q = g_AxM.copy()
      alphas = []
      for s, yv, rho in zip(reversed(s_hist), reversed(y_hist), reversed(rho_hist)):
        alpha = rho * np.einsum("am,am->a", s, q)
        q -= alpha[:, None] * yv
        alphas.append(alpha)
      if s_hist:
        sy = np.einsum("am,am->a", s_hist[-1], y_hist[-1])
        yy = np.einsum("am,am->a", y_hist[-1], y_hist[-1])
        q *= np.where((yy > 0) & (sy > 0), sy / np.where(yy > 0, yy, 1.0), 1.0)[:, None]
      else:
        q /= np.maximum(1.0, np.abs(g_AxM).sum(axis=1))[:, None]
      for s, yv, rho, alpha in zip(s_hist, y_hist, rho_hist, reversed(alphas)):
        beta = rho * np.einsum("am,am->a", yv, q)
        q += (alpha - beta)[:, None] * s
      d_AxM = -q
      d_AxM[frozen_A] = 0.0
      slope_A = np.einsum("am,am->a", g_AxM, d_AxM)
      bad = (slope_A >= 0) & ~frozen_A  # not a descent direction (numerics): steepest descent.
      if np.any(bad):
        d_AxM[bad] = -g_AxM[bad]
        slope_A[bad] = -np.einsum("am,am->a", g_AxM[bad], g_AxM[bad])
      # A step the objective cannot resolve at this precision ends the problem (L-BFGS
      # steps decrease f by about -slope / 2).
      tiny_A = ~frozen_A & (-slope_A <= 8 * np.finfo(dtype).eps * np.abs(obj))
      d_AxM[tiny_A] = 0.0
      slope_A[tiny_A] = 0.0
      d = d_AxM.reshape(grad.shape)

      # Armijo backtracking: logits along the line are z + t (X d), one product for all t.
      zd = probs.matmul(d)
      step_A = np.ones(a)
      new_obj = obj.copy()
      new_resid = np.empty_like(resid)
      pending = np.arange(a)
      for _ in range(8):
        t = step_A[pending]
        if len(pending) == a:  # the common case: no gathers.
          trial_obj, trial_resid = probs.evaluate(z + t.astype(dtype) * zd, theta + t[:, None, None] * d)
        else:
          trial_obj, trial_resid = probs.subset(pending).evaluate(
              z[..., pending] + t.astype(dtype) * zd[..., pending], theta[pending] + t[:, None, None] * d[pending])
        ok = trial_obj <= obj[pending] + 1e-4 * t * slope_A[pending]
        new_obj[pending[ok]] = trial_obj[ok]
        if np.all(ok) and len(pending) == a:
          new_resid = trial_resid
        else:
          new_resid[..., pending[ok]] = trial_resid[..., ok]
        pending = pending[~ok]
        if not len(pending):
          break
        step_A[pending] *= 0.25
      stalled_A = tiny_A.copy()
      if len(pending):  # no decrease the objective's precision can show: done.
        stalled_A[pending] = True
        step_A[pending] = 0.0
        new_resid[..., pending] = resid[..., pending]

      s_AxM = step_A[:, None] * d_AxM
      theta = theta + s_AxM.reshape(theta.shape)
      if it % 50 == 0:  # running logits drift by rounding; recompute them now and then.
        z = probs.matmul(theta)
        new_obj, new_resid = probs.evaluate(z, theta)
      else:
        z += step_A.astype(dtype) * zd
      new_grad = probs.gradient(new_resid, theta)
      y_AxM = (new_grad - grad).reshape(a, -1)
      sy = np.einsum("am,am->a", s_AxM, y_AxM)
      rho = np.where(sy > 1e-16, 1.0 / np.where(sy > 1e-16, sy, 1.0), 0.0)  # rho 0 drops a pair.
      s_hist.append(s_AxM)
      y_hist.append(y_AxM)
      rho_hist.append(rho)
      if len(s_hist) > history:
        s_hist.pop(0), y_hist.pop(0), rho_hist.pop(0)
      obj, resid, grad = new_obj, new_resid, new_grad

      done_A = ~frozen_A & (stalled_A | (np.abs(grad).reshape(a, -1).max(axis=1) <= tol))
      hit_max_A = ~frozen_A & ~done_A & (it == max_iter)
      done_A |= hit_max_A
      if np.any(done_A):
        ids = active_A[done_A]
        theta_out[ids] = theta[done_A]
        n_iter_out[ids] = it
        converged_out[ids] = ~hit_max_A[done_A]
        frozen_A |= done_A
      if np.all(frozen_A):
        break
      # Compacting copies every [N, K, A] array, so wait until it drops a fair share.
      if np.sum(frozen_A) >= 0.25 * a:
        keep = ~frozen_A
        active_A, frozen_A = active_A[keep], frozen_A[keep]
        probs = probs.subset(keep)
        theta, z, resid, grad, obj = theta[keep], z[..., keep], resid[..., keep], grad[keep], obj[keep]
        s_hist = [s[keep] for s in s_hist]
        y_hist = [yv[keep] for yv in y_hist]
        rho_hist = [r[keep] for r in rho_hist]

  coef_PxFxK = theta_out[:, :-1]
  intercept_PxK = theta_out[:, -1] - np.einsum("f,pfk->pk", mean_F, coef_PxFxK)
  return LogisticFit(coef_PxFxK, intercept_PxK, classes, n_iter_out, converged_out, theta_out)


# ---------------------------------------------------------------------- ridge


def ridge_loo(x_NxF: np.ndarray, y_N: np.ndarray, *, alphas_A) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Ridge regression (unpenalised intercept) for several strengths, with exact leave-one-out.

  Minimises ||y - X w - b||^2 + alpha ||w||^2. One eigendecomposition of the centred
  Gram matrix gives every alpha's fit and its hat-matrix diagonal h, hence the exact
  leave-one-out predictions y_i - (y_i - yhat_i) / (1 - h_ii) (as RidgeCV's default).

  Returns:
    coef [A, F], intercept [A], leave-one-out predictions [A, N].
  """
  x_NxF = np.asarray(x_NxF, np.float64)
  y_N = np.asarray(y_N, np.float64)
  alphas_A = np.asarray(alphas_A, np.float64)
  n = len(y_N)
  mean_F, mean_y = x_NxF.mean(axis=0), y_N.mean()
  xc_NxF = x_NxF - mean_F
  evals_F, evecs_FxF = np.linalg.eigh(xc_NxF.T @ xc_NxF)
  evals_F = np.maximum(evals_F, 0.0)
  u_NxF = xc_NxF @ evecs_FxF  # the data in the eigenbasis; ||column k||^2 = eval k.
  uy_F = u_NxF.T @ (y_N - mean_y)
  shrink_FxA = 1.0 / (evals_F[:, None] + alphas_A[None, :])
  coef_AxF = (evecs_FxF @ (uy_F[:, None] * shrink_FxA)).T
  fitted_NxA = u_NxF @ (uy_F[:, None] * shrink_FxA) + mean_y
  hat_NxA = (u_NxF ** 2) @ shrink_FxA + 1.0 / n
  loo_NxA = y_N[:, None] - (y_N[:, None] - fitted_NxA) / (1.0 - hat_NxA)
  return coef_AxF, mean_y - coef_AxF @ mean_F, loo_NxA.T
