/* Single-precision exp, tanh and sigmoid for the generated C, written so that a loop calling
   them vectorises (AVX2, AVX-512): no branches, no calls, no errno, bit casts by memcpy.
   libm's expf and tanhf are calls the compiler cannot vectorise; over an LSTM's gates they
   cost more than its matrix products. Accuracy against a float64 reference is measured in
   tests/test_vecmath.py (max ulp error printed there and kept in the README). The polynomials'
   multiply-adds are fused where the ISA can (ft_fmaf): the generated C is compiled with
   -ffp-contract=off, which fuses nothing by itself. */

static inline float ft_ldexp2f(float p, int n)
{  /* p * 2^n for n in [-152, 130], as two exact scalings so that no step overflows early
      and results below FLT_MIN round once, to the subnormal they belong to */
  const int n1 = n >> 1, n2 = n - n1;
  const int b1 = (n1 + 127) << 23, b2 = (n2 + 127) << 23;
  float s1, s2;
  __builtin_memcpy(&s1, &b1, sizeof s1);
  __builtin_memcpy(&s2, &b2, sizeof s2);
  return p * s1 * s2;
}

static inline float ft_expf(float x)
{  /* e^x = 2^n e^r, n = round(x / ln 2), |r| <= ln 2 / 2; e^r by Cephes' degree-6 polynomial */
  const float xc = x < -104.0f ? -104.0f : (x > 89.0f ? 89.0f : x);  /* beyond: 0 and inf */
  /* n = rint(xc / ln 2) by the 1.5 * 2^23 shift (exact for |n| < 2^22), which SSE2 has;
     rintf needs SSE4.1's roundps, so without it the loop would not vectorise */
  const float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = xc - n * 0.693359375f;  /* ln 2 in two parts: n * hi is exact */
  r = r - n * -2.12194440e-4f;
  /* the polynomial in Estrin's form: three independent pairs, not one chain of five
     multiply-adds (a vector of exps waits on latency, not issue: 8-27% faster, SSE2 to AVX-512) */
  const float r2 = r * r;
  const float p54 = ft_fmaf(1.9875691500e-4f, r, 1.3981999507e-3f);
  const float p32 = ft_fmaf(8.3334519073e-3f, r, 4.1665795894e-2f);
  const float p10 = ft_fmaf(1.6666665459e-1f, r, 5.0000001201e-1f);
  const float p = ft_fmaf(ft_fmaf(ft_fmaf(p54, r2, p32), r2, p10), r2, r) + 1.0f;
  const float y = ft_ldexp2f(p, (int)n);
  return x != x ? x : y;  /* NaN in, NaN out */
}

static inline float ft_tanhf(float x)
{  /* on |x|, the sign restored at the end (tanh(-0) = -0): below 0.625 Cephes' odd
     polynomial, beyond 1 - 2 / (e^{2|x|} + 1) */
  const float a = __builtin_fabsf(x), z = a * a;
  float p = -5.70498872745e-3f;
  p = ft_fmaf(p, z, 2.06390887954e-2f);
  p = ft_fmaf(p, z, -5.37397155531e-2f);
  p = ft_fmaf(p, z, 1.33314422036e-1f);
  p = ft_fmaf(p, z, -3.33332819422e-1f);
  const float small = ft_fmaf(p * z, a, a);
  const float big = 1.0f - 2.0f / (ft_expf(2.0f * a) + 1.0f);
  return __builtin_copysignf(a < 0.625f ? small : big, x);
}

static inline float ft_sigmoidf(float x)
{  /* 1 / (1 + e^-x) for x >= 0, else e^x / (1 + e^x): never e^-x = inf, so the tail below x = -88
      is e^x's (subnormal) rather than 0, as eager's sigmoid (polyft.primitives) */
  const float e = ft_expf(-__builtin_fabsf(x));
  return (x >= 0.0f ? 1.0f : e) / (1.0f + e);
}
