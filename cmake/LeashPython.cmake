# Finds Debian's Python (/usr/bin/python3, where python3-numpy and python3-torch live, unless
# -DPython_EXECUTABLE says otherwise) and pybind11 (python3-pybind11) for the Python package,
# and sets LEASH_PYTHON_ENABLED. LEASH_PYTHON=AUTO builds it when both are found and the
# build is not instrumented (a sanitizer or fuzzing runtime cannot load into python3).
set(LEASH_PYTHON_ENABLED OFF)
if(LEASH_PYTHON STREQUAL "OFF")
  message(STATUS "leash: the Python package is off (LEASH_PYTHON=OFF)")
  return()
endif()
if(LEASH_PYTHON STREQUAL "AUTO" AND (LEASH_SANITIZE OR LEASH_FUZZ))
  message(STATUS "leash: the Python package is not built in a sanitizer or fuzzing build "
                 "(-DLEASH_PYTHON=ON to force it)")
  return()
endif()
if(NOT DEFINED Python_EXECUTABLE AND EXISTS /usr/bin/python3)
  set(Python_EXECUTABLE /usr/bin/python3)
endif()
set(PYBIND11_FINDPYTHON ON)
find_package(Python 3.9 COMPONENTS Interpreter Development.Module QUIET)
if(Python_FOUND)
  find_package(pybind11 2.6 CONFIG QUIET)
endif()
if(NOT Python_FOUND OR NOT pybind11_FOUND)
  set(_why "pybind11 was not found (apt-get install python3-pybind11 python3-dev, or "
           "scripts/install-deps.sh)")
  if(NOT Python_FOUND)
    set(_why "no Python 3 interpreter with its headers was found (apt-get install python3-dev)")
  endif()
  if(LEASH_PYTHON STREQUAL "ON")
    message(FATAL_ERROR "leash: LEASH_PYTHON=ON but ${_why}")
  endif()
  message(STATUS "leash: the Python package is not built: ${_why}")
  return()
endif()
set(LEASH_PYTHON_ENABLED ON)
message(STATUS "leash: the Python package is built for ${Python_EXECUTABLE} "
               "(Python ${Python_VERSION}, pybind11 ${pybind11_VERSION})")
