# The target boundary (DESIGN.md): the compiler (ir, ops, autodiff, passes, plan) and the target
# interface include nothing of a backend; they ask a target::Target. Nor do they know of
# data-parallel training (MPI, src/distributed). Run as a test:
#   cmake -DSOURCE_DIR=<repository> -P cmake/CheckLayers.cmake
set(violations "")
foreach(layer ir ops autodiff passes plan target)
  file(GLOB_RECURSE files ${SOURCE_DIR}/src/${layer}/*.cpp ${SOURCE_DIR}/src/${layer}/*.hpp)
  foreach(file ${files})
    file(STRINGS ${file} includes
         REGEX "^#include (\"backends/|<mpi\\.h>|\"meganeura/distributed\\.hpp\")")
    foreach(line ${includes})
      file(RELATIVE_PATH relative ${SOURCE_DIR} ${file})
      string(APPEND violations "\n  ${relative}: ${line}")
    endforeach()
  endforeach()
endforeach()
if(violations)
  message(FATAL_ERROR
          "the compiler includes a backend (ask target::Target instead) or MPI:${violations}")
endif()
