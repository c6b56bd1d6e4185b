# Sourced by scripts/install_horovod.sh and scripts/build_horovod_gpu.sh: the
# local changes every Horovod 0.28.1 build makes to the sdist's sources.
#
#   patch_horovod_sources SRC TF_VERSION   # SRC: the unpacked sdist
#
# Returns non-zero (with a message on stderr) where a line to change is not
# where it was: a changed sdist must be looked at, not built half-patched.
# Raise HOROVOD_PATCH_LEVEL whenever these change (it keys the wheel cache).
HOROVOD_PATCH_LEVEL=2

patch_horovod_sources() {
  local src=$1 tf_version=$2
  # Gloo's controller reserves, instead of sizing, its list of global ranks,
  # so the list stays empty and the stall inspector finds no missing rank:
  # with Gloo, HOROVOD_STALL_SHUTDOWN_TIME_SECONDS never ends a stalled job.
  local controller="$src/horovod/common/gloo/gloo_controller.cc"
  if ! grep -q 'global_ranks_\.reserve(size_);' "$controller"; then
    echo "expected 'global_ranks_.reserve(size_);' in $controller to patch; found none" >&2
    return 1
  fi
  sed -i 's/global_ranks_\.reserve(size_);/global_ranks_.resize(size_);/' "$controller"

  # group_table.h uses std::string without including <string>, which GCC 13
  # and later no longer bring in through the other standard headers.
  local groups="$src/horovod/common/group_table.h"
  if ! grep -q '^#include <vector>$' "$groups"; then
    echo "expected '#include <vector>' in $groups to insert after; found none" >&2
    return 1
  fi
  grep -q '^#include <string>$' "$groups" || sed -i 's/^#include <vector>$/#include <string>\n#include <vector>/' "$groups"

  # TensorFlow 2.19 changed the XLA custom-call API that xla_mpi_ops.cc uses
  # (it fails to compile). Those ops serve XLA-compiled functions only; the
  # regular Horovod ops do not need them.
  if [ "$(printf '%s\n' 2.19 "$tf_version" | sort -V | head -1)" = 2.19 ]; then
    local lists="$src/horovod/tensorflow/CMakeLists.txt"
    if ! grep -q 'xla_mpi_ops\.cc' "$lists"; then
      echo "expected an xla_mpi_ops.cc line in $lists to remove for TensorFlow $tf_version; found none" >&2
      return 1
    fi
    echo "TensorFlow $tf_version >= 2.19: building without xla_mpi_ops.cc" >&2
    sed -i '/xla_mpi_ops\.cc/d' "$lists"
  fi
}

# For builds with GPU operations (scripts/build_horovod_gpu.sh) on TensorFlow
# >= 2.16, whose libraries no longer export the GPU DenseUpdate functors:
# Horovod's in-place broadcast names DenseUpdate<GpuDevice, T, ASSIGN>
# through TensorFlow's training_op_helpers.h (copy-on-write of a variable's
# buffer), and its library then fails to load ("undefined symbol ...
# DenseUpdate<Eigen::GpuDevice, bool, 2>"). Assigning one flat tensor to
# another of the same size is a device-to-device copy on the op's stream;
# these definitions go before their first use.
patch_horovod_gpu_sources() {
  local src=$1 tf_version=$2
  [ "$(printf '%s\n' 2.16 "$tf_version" | sort -V | head -1)" = 2.16 ] || return 0
  local ops="$src/horovod/tensorflow/mpi_ops.cc"
  if ! grep -q '^using namespace horovod;$' "$ops"; then
    echo "expected 'using namespace horovod;' in $ops to insert after; found none" >&2
    return 1
  fi
  local defs="$src/.gpu_assign.inc"
  cat > "$defs" <<'CPP'
#if HAVE_CUDA
namespace tensorflow {
namespace functor {
#define HVD_GPU_ASSIGN(T)                                                         \
  template <>                                                                     \
  void DenseUpdate<Eigen::GpuDevice, T, ASSIGN>::operator()(                      \
      const Eigen::GpuDevice& d, typename TTypes<T>::Flat params,                 \
      typename TTypes<T>::ConstFlat update) {                                     \
    d.memcpy(params.data(), update.data(), params.size() * sizeof(T));            \
  }
HVD_GPU_ASSIGN(uint8)
HVD_GPU_ASSIGN(int8)
HVD_GPU_ASSIGN(int32)
HVD_GPU_ASSIGN(int64)
HVD_GPU_ASSIGN(Eigen::half)
HVD_GPU_ASSIGN(float)
HVD_GPU_ASSIGN(double)
HVD_GPU_ASSIGN(bool)
#undef HVD_GPU_ASSIGN
}  // namespace functor
}  // namespace tensorflow
#endif  // HAVE_CUDA
CPP
  sed -i "/^using namespace horovod;\$/r $defs" "$ops"
  # The same libraries no longer export stream_executor::gpu::AsGpuStreamValue,
  # which Horovod declares itself to take the CUDA stream of an op; a Stream
  # hands it out as platform_specific_handle().
  if ! grep -q '^GpuStreamHandle AsGpuStreamValue(Stream\* stream);$' "$ops" ||
     ! grep -q '^#endif // TENSORFLOW_VERSION >= 2011000000$' "$ops"; then
    echo "expected Horovod's AsGpuStreamValue declaration in $ops to replace; found none" >&2
    return 1
  fi
  sed -i 's|^GpuStreamHandle AsGpuStreamValue(Stream\* stream);$|// (defined below, after stream.h)|' "$ops"
  local stream_of="$src/.gpu_stream.inc"
  cat > "$stream_of" <<'CPP'
namespace stream_executor {
namespace gpu {
inline GpuStreamHandle AsGpuStreamValue(Stream* stream) {
  return static_cast<GpuStreamHandle>(stream->platform_specific_handle().stream);
}
}  // namespace gpu
}  // namespace stream_executor
CPP
  sed -i "0,/^#endif \/\/ TENSORFLOW_VERSION >= 2011000000\$/{/^#endif \/\/ TENSORFLOW_VERSION >= 2011000000\$/r $stream_of
}" "$ops"
  echo "TensorFlow $tf_version >= 2.16: GPU DenseUpdate<ASSIGN> and AsGpuStreamValue defined in mpi_ops.cc" >&2
}
