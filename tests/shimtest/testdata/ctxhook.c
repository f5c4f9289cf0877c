/*
 * ctxhook: a library linked into a program ahead of the driver, so that it
 * sits between the shim and the driver as another interposer would: the
 * shim's real cuCtxDestroy_v2 and cuCtxDetach are these. Each calls the
 * driver's and then, if the program set one, after_ctx_destroy: what other
 * threads do right after the driver destroyed (or detached) the context,
 * before the shim learns of it.
 */
#include <dlfcn.h>

#include <spillway/cuda.h>

void (*after_ctx_destroy)(void);

static CUresult then_after(CUresult rc)
{
    if (rc == CUDA_SUCCESS && after_ctx_destroy)
        after_ctx_destroy();
    return rc;
}

CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    CUresult (*destroy)(CUcontext) = (CUresult(*)(CUcontext))dlsym(RTLD_NEXT, "cuCtxDestroy_v2");
    return then_after(destroy ? destroy(ctx) : CUDA_ERROR_NOT_FOUND);
}

CUresult cuCtxDetach(CUcontext ctx)
{
    CUresult (*detach)(CUcontext) = (CUresult(*)(CUcontext))dlsym(RTLD_NEXT, "cuCtxDetach");
    return then_after(detach ? detach(ctx) : CUDA_ERROR_NOT_FOUND);
}
