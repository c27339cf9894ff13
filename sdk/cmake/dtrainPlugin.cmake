# dtrain_add_plugin(NAME SOURCES src... [LIBS lib...])
#
# Builds plugin NAME as the module dtrain_NAME.so the way dtrain loads it:
# hidden visibility (the only exported symbol is its entry,
# DT_PLUGIN_ENTRY), no undefined symbols, linked against the SDK headers
# (dtrain::sdk) and the SDK helper library (dtrain::dtrain_sdk: a static,
# position-independent archive, so a plugin carries only the helpers it
# calls and exports nothing more).  LIBS are linked privately after them.
#
# One implementation for both routes; the dtrain tree includes this file
# too and sets three variables that a build against the installed SDK
# (find_package(dtrain)) leaves unset:
#   DTRAIN_PLUGIN_TARGET_PREFIX  target name prefix (in the tree "plugin_":
#                                the target is plugin_NAME); unset: NAME
#   DTRAIN_PLUGIN_BUILD_DIR      where the module is built (in the tree one
#                                folder for all, so the build tree runs);
#                                unset: the current binary folder
#   DTRAIN_PLUGIN_INSTALL_DIR    where `cmake --install` puts it; unset:
#                                not installed
function(dtrain_add_plugin name)
  cmake_parse_arguments(P "" "" "SOURCES;LIBS" ${ARGN})
  set(tgt "${DTRAIN_PLUGIN_TARGET_PREFIX}${name}")
  add_library(${tgt} MODULE ${P_SOURCES})
  set_target_properties(${tgt} PROPERTIES
    OUTPUT_NAME "dtrain_${name}" PREFIX ""
    C_VISIBILITY_PRESET hidden CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON)
  if(DTRAIN_PLUGIN_BUILD_DIR)
    set_target_properties(${tgt} PROPERTIES
      LIBRARY_OUTPUT_DIRECTORY "${DTRAIN_PLUGIN_BUILD_DIR}")
  endif()
  target_link_libraries(${tgt} PRIVATE dtrain::sdk dtrain::dtrain_sdk ${P_LIBS})
  target_link_options(${tgt} PRIVATE -Wl,--no-undefined)
  if(DTRAIN_PLUGIN_INSTALL_DIR)
    install(TARGETS ${tgt} LIBRARY DESTINATION "${DTRAIN_PLUGIN_INSTALL_DIR}")
  endif()
endfunction()
